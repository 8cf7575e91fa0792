package lease_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/pgtest"
)

// A dedupe key's window counts from its message's delivery, not from its
// enqueue: a message that waited longer than the window (retries, an
// outage) keeps its key for the whole window after it is delivered, so a
// producer's late retry is still a duplicate, not a second charge.
func TestDedupeWindowCountsFromDelivery(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	charge := outbox.Message{Namespace: "billing", Topic: "charge", DedupeKey: "invoice-42", Payload: json.RawMessage(`{"amount": 9900}`)}
	first, err := outbox.Enqueue(ctx, db.Pool, charge)
	if err != nil {
		t.Fatal(err)
	}
	// It waited eight days (an outage), then was delivered just now.
	age(t, db.Pool, 8*24*time.Hour)
	msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
	if _, err := store.CompleteBatch(ctx, "w", dispatched(msgs)); err != nil {
		t.Fatal(err)
	}
	res, err := store.Purge(ctx, lease.PurgeParams{AttemptsOlderThan: 30 * 24 * time.Hour, DedupeOlderThan: 7 * 24 * time.Hour, MaxRows: 100})
	if err != nil {
		t.Fatal(err)
	}
	if res.Dedupe != 0 {
		t.Fatalf("the purge forgot %d dedupe keys of a message delivered a moment ago", res.Dedupe)
	}
	again, err := outbox.Enqueue(ctx, db.Pool, charge)
	if err != nil {
		t.Fatal(err)
	}
	if again.Inserted || again.ID != first.ID {
		t.Fatalf("the producer's retry was enqueued again (%+v): a double charge", again)
	}
	// A week after the delivery, the key goes.
	age(t, db.Pool, 8*24*time.Hour)
	if res, err = store.Purge(ctx, lease.PurgeParams{AttemptsOlderThan: 30 * 24 * time.Hour, DedupeOlderThan: 7 * 24 * time.Hour, MaxRows: 100}); err != nil || res.Dedupe != 1 {
		t.Fatalf("a week after delivery: purged %+v (%v), want the key", res, err)
	}
	// The archive must outlive the window it is read for.
	if _, err := store.Purge(ctx, lease.PurgeParams{AttemptsOlderThan: 24 * time.Hour, DedupeOlderThan: 7 * 24 * time.Hour, MaxRows: 100}); err == nil {
		t.Fatal("an attempts retention shorter than the dedupe retention was accepted")
	}
}

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
	// And a completion after its lease ran out is refused.
	msgs, _ = store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Second})
	time.Sleep(1500 * time.Millisecond)
	completions, err := store.CompleteBatch(ctx, "w", dispatched(msgs))
	if err != nil || completions[0].Status != lease.StatusLeaseLost {
		t.Fatalf("completion past the lease: %+v %v, want lease_lost", completions, err)
	}
}
