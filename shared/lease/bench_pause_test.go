package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// BenchmarkClaimBesidePausedBacklog measures one claim of 1,000 from 50,000
// due messages with 50,000 of a paused namespace due before them: compare
// it with BenchmarkClaimOfOrderedKeys/keys=0, the same claim with nothing
// paused. Each claim is rolled back, so that every iteration claims from
// the same queue.
func BenchmarkClaimBesidePausedBacklog(b *testing.B) {
	const messages, batch = 50_000, 1000
	db := pgtest.New(b)
	ctx := context.Background()
	enqueue(b, db.Pool, messages, func(i int) outbox.Message {
		return outbox.Message{Namespace: "held", Topic: "usage", Payload: payload512}
	})
	store := lease.NewStore(db.Pool)
	if _, err := store.Pause(ctx, lease.PauseRequest{Namespace: "held", Reason: "benchmark", Operator: "bench"}); err != nil {
		b.Fatal(err)
	}
	enqueue(b, db.Pool, messages, func(i int) outbox.Message {
		return outbox.Message{Namespace: "billing", Topic: "usage", Payload: payload512}
	})
	if _, err := db.Pool.Exec(ctx, "VACUUM ANALYZE outbox.pending"); err != nil {
		b.Fatal(err)
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	b.ResetTimer()
	for range b.N {
		tx, err := conn.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		msgs, err := lease.NewStore(tx).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "bench", BatchSize: batch, MaxRun: 100, Lease: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		if len(msgs) != batch || msgs[0].Namespace != "billing" {
			b.Fatalf("claimed %d, want %d of billing", len(msgs), batch)
		}
		if err := tx.Rollback(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
