package outboxdb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

var payload512 = json.RawMessage(fmt.Sprintf(`{"tenant_id":"tenant-42","turn_id":"turn-1","request_id":"req-1","model":"m-large","tokens_in":1200,"tokens_out":340,"policy_version_applied":7,"pad":%q}`,
	strings.Repeat("x", 512-170)))

// BenchmarkEnqueue measures one message per call, each in its own
// transaction (autocommit), as a producer finalising one business change.
func BenchmarkEnqueue(b *testing.B) {
	db := pgtest.New(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: fmt.Sprintf("k-%d", i), Payload: payload512}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkEnqueueOrdered is BenchmarkEnqueue with an ordering key per
// message, over 100 keys: each commit also settles its key's head.
func BenchmarkEnqueueOrdered(b *testing.B) {
	db := pgtest.New(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: fmt.Sprintf("k-%d", i),
			OrderingKey: fmt.Sprintf("tenant-%d", i%100), Payload: payload512}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkEnqueueBatch measures EnqueueBatch: one round trip per batch.
func BenchmarkEnqueueBatch(b *testing.B) {
	for _, size := range []int{100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			db := pgtest.New(b)
			ctx := context.Background()
			b.ResetTimer()
			for i := range b.N {
				batch := make([]outbox.Message, size)
				for j := range batch {
					batch[j] = outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: fmt.Sprintf("k-%d-%d", i, j), Payload: payload512}
				}
				if _, err := outbox.EnqueueBatch(ctx, db.Pool, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
