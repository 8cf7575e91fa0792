package lease_test

import (
	"context"
	"testing"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// A producer transaction open while its topic's pause is lifted enqueues
// its message marked paused (it saw the pause); the resume cannot see the
// uncommitted row to unmark it, so after both commit the message is marked
// paused with no pause left. The reaper unmarks it. Found by the soak: the
// queue never drained.
func TestReaperUnmarksAMessageEnqueuedAcrossItsResume(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 1, topicMessage("billing", "usage"))
	if _, err := store.Pause(ctx, lease.PauseRequest{Namespace: "billing", Topic: "usage", Reason: "hold", Operator: "ana"}); err != nil {
		t.Fatal(err)
	}

	producer, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := outbox.Enqueue(ctx, producer, topicMessage("billing", "usage")(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Resume(ctx, lease.PauseRequest{Namespace: "billing", Topic: "usage", Reason: "back", Operator: "ana"}); err != nil {
		t.Fatal(err)
	}
	if err := producer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE paused`); n != 1 {
		t.Fatalf("%d messages marked paused after the resume, want the one enqueued across it (else this test shows nothing)", n)
	}
	if got := claimRun(t, store, "w", 10, 1); len(got) != 1 {
		t.Fatalf("before the reaper the claim took %d, want the one resumed", len(got))
	}
	if _, err := store.RepairExpiredLeases(ctx, "reaper", 100); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE paused`); n != 0 {
		t.Fatalf("%d messages still marked paused after the reaper ran", n)
	}
	if got := claimRun(t, store, "w", 10, 1); len(got) != 1 {
		t.Fatalf("after the reaper the claim took %d, want the one enqueued across the resume", len(got))
	}
}
