package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// Leases are judged by the clock, not by the start of the transaction the
// call runs in: inside a transaction that began before a lease expired, the
// expired lease is still expired.
func TestLeaseChecksUseTheClock(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	enqueue(t, db.Pool, 2, plain)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	store := lease.NewStore(tx)
	msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 2, Lease: time.Second})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("claim: %d %v", len(msgs), err)
	}
	time.Sleep(1500 * time.Millisecond) // the lease runs out; now() does not move
	n, err := store.RepairExpiredLeases(ctx, "reaper", 10)
	if err != nil || n != 1+1 {
		t.Fatalf("repair inside the transaction requeued %d (%v), want the 2 expired leases", n, err)
	}
	// The requeued messages are due by the clock, though not by the
	// transaction's start; a completion after its lease ran out is refused.
	msgs, err = store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Second})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("claim inside the transaction after the repair: %d messages (%v), want 1 of the 2 requeued", len(msgs), err)
	}
	time.Sleep(1500 * time.Millisecond)
	completions, err := store.CompleteBatch(ctx, "w", dispatched(msgs))
	if err != nil || len(completions) != 1 || completions[0].Status != outboxtype.StatusLeaseLost {
		t.Fatalf("completion past the lease: %+v %v, want lease_lost", completions, err)
	}
}
