package lease_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
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
}

// The window cannot be defeated by splitting the purge into calls that each
// pass its checks: the archive purged first with an hour's retention, then
// the keys with a week's, must not forget the key of a charge delivered two
// hours ago; nor may an operator's purge of the audit trail forget the key
// of a message discarded within the window. The outcome's time outlives its
// archived row, so each key still goes a full window after its outcome.
func TestDedupeWindowSurvivesASplitPurge(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	charge := outbox.Message{Namespace: "billing", Topic: "charge", DedupeKey: "invoice-42", Payload: json.RawMessage(`{"amount": 9900}`)}
	void := outbox.Message{Namespace: "billing", Topic: "charge", DedupeKey: "invoice-43", Payload: json.RawMessage(`{"amount": 100}`)}
	enqueued := map[string]outbox.Enqueued{}
	for _, m := range []outbox.Message{charge, void} {
		res, err := outbox.Enqueue(ctx, db.Pool, m)
		if err != nil {
			t.Fatal(err)
		}
		enqueued[m.DedupeKey] = res
	}
	// Both waited eight days (an outage); then the charge was delivered and
	// the other discarded by an operator, two days ago.
	shiftDedupe(t, db.Pool, 8*24*time.Hour)
	owner := lease.NewStore(db.Pool)
	msgs, err := owner.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("claim: %d %v", len(msgs), err)
	}
	for _, m := range msgs {
		if m.ID == enqueued["invoice-42"].ID {
			if _, err := owner.CompleteBatch(ctx, "w", dispatched([]outboxtype.Message{m})); err != nil {
				t.Fatal(err)
			}
		} else if _, err := owner.CompleteBatch(ctx, "w", []lease.Result{{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeRetryable, ErrorCode: "HTTP_503"}}); err != nil {
			t.Fatal(err)
		}
	}
	operatorConn := pgtest.Connect(t, db.LoginAs(t, "outbox_operator"))
	operator := lease.NewStore(operatorConn)
	if gone, err := operator.Discard(ctx, lease.DiscardRequest{MessageIDs: []uuid.UUID{enqueued["invoice-43"].ID}, Reason: "voided"}); err != nil || len(gone) != 1 {
		t.Fatalf("discard: %v %v", gone, err)
	}
	shiftAttempts(t, db.Pool, 2*24*time.Hour)

	// Each call is within the rules; together they would erase the window.
	dispatcher := lease.NewStore(pgtest.Connect(t, db.LoginAs(t, "outbox_dispatcher")))
	if _, err := dispatcher.Purge(ctx, lease.PurgeParams{AttemptsOlderThan: time.Hour, MaxRows: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := operatorConn.Exec(ctx, `SELECT outbox.purge_audit('1 day', 100)`); err != nil {
		t.Fatal(err)
	}
	res, err := dispatcher.Purge(ctx, lease.PurgeParams{DedupeOlderThan: 7 * 24 * time.Hour, MaxRows: 100})
	if err != nil {
		t.Fatal(err)
	}
	if res.Dedupe != 0 {
		t.Errorf("the second call forgot %d dedupe keys of messages that went two days ago", res.Dedupe)
	}
	for _, m := range []outbox.Message{charge, void} {
		again, err := outbox.Enqueue(ctx, db.Pool, m)
		if err != nil {
			t.Fatal(err)
		}
		if again.Inserted || again.ID != enqueued[m.DedupeKey].ID {
			t.Fatalf("the producer's retry of %s was enqueued again (%+v): a double charge", m.DedupeKey, again)
		}
	}

	// A week after their outcomes, both keys go, though the rows that
	// recorded the outcomes went first.
	shiftDedupe(t, db.Pool, 6*24*time.Hour)
	shiftAttempts(t, db.Pool, 6*24*time.Hour)
	if res, err = dispatcher.Purge(ctx, lease.PurgeParams{DedupeOlderThan: 7 * 24 * time.Hour, MaxRows: 100}); err != nil || res.Dedupe != 2 {
		t.Fatalf("a week after the outcomes: purged %+v (%v), want both keys", res, err)
	}
}

// shiftDedupe moves every dedupe key's times back by d.
func shiftDedupe(t *testing.T, pool *pgxpool.Pool, d time.Duration) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE outbox.dedupe SET created_at = created_at - $1::interval, settled_at = settled_at - $1::interval`, d); err != nil {
		t.Fatal(err)
	}
}

// shiftAttempts moves every archived outcome back by d.
func shiftAttempts(t *testing.T, pool *pgxpool.Pool, d time.Duration) {
	t.Helper()
	for _, stmt := range []string{
		`ALTER TABLE outbox.attempts DISABLE TRIGGER attempts_append_only`,
		`UPDATE outbox.attempts SET created_at = created_at - $1::interval`,
		`ALTER TABLE outbox.attempts ENABLE TRIGGER attempts_append_only`,
	} {
		var args []any
		if strings.Contains(stmt, "$1") {
			args = []any{d}
		}
		if _, err := pool.Exec(context.Background(), stmt, args...); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}
