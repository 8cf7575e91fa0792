package proposal_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/proposal"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/pgtest"
)

// These benchmarks isolate the two store proposals. Each iteration
// enqueues 1,000 messages of 512 bytes (not timed), claims them and
// completes them as dispatched, as a dispatcher does; the benchmark reports
// the claim's or the completion's milliseconds per batch. Run them with
//
//	go test -run '^$' -bench . ./internal/proposal
//
// against the PostgreSQL at OUTBOX_TEST_DATABASE_URL. They print figures;
// they do not judge them.

const batch = 1000

func cycle(b *testing.B, v proposal.Variant, timeClaim bool) {
	db := pgtest.New(b)
	ctx := context.Background()
	if v.LeanComplete {
		q, err := proposal.LeanCompleteSQL()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	store := proposal.StoreFor(db.Pool, v)
	payload := workload.Payload(512)
	msgs := make([]outbox.Message, batch)
	var timed time.Duration
	n := 0
	for b.Loop() {
		for i := range msgs {
			msgs[i] = outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: fmt.Sprintf("k-%d", n), Payload: payload}
			n++
		}
		if _, err := outbox.EnqueueBatch(ctx, db.Pool, msgs); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		claimed, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "bench", BatchSize: batch, Lease: time.Minute})
		if err != nil || len(claimed) != batch {
			b.Fatalf("claimed %d: %v", len(claimed), err)
		}
		if timeClaim {
			timed += time.Since(start)
		}
		results := make([]lease.Result, len(claimed))
		for i, m := range claimed {
			results[i] = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: lease.Dispatched, Target: "routes[0]"}
		}
		start = time.Now()
		if _, err := store.CompleteBatch(ctx, "bench", results); err != nil {
			b.Fatal(err)
		}
		if !timeClaim {
			timed += time.Since(start)
		}
	}
	b.ReportMetric(float64(timed.Microseconds())/float64(b.N)/1000, "ms/batch")
}

// BenchmarkClaimBatch times ClaimBatch(1000) as it is and with the payload
// scanned as raw bytes.
func BenchmarkClaimBatch(b *testing.B) {
	b.Run("as_is", func(b *testing.B) { cycle(b, proposal.Variants[0], true) })
	b.Run("raw_payload_scan", func(b *testing.B) { cycle(b, proposal.Variant{RawScan: true}, true) })
}

// BenchmarkCompleteBatch times CompleteBatch(1000) as it is and with the
// lean completion function.
func BenchmarkCompleteBatch(b *testing.B) {
	b.Run("as_is", func(b *testing.B) { cycle(b, proposal.Variants[0], false) })
	b.Run("lean_completion", func(b *testing.B) { cycle(b, proposal.Variant{LeanComplete: true}, false) })
}
