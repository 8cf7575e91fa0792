package migrations_test

import (
	"context"
	"testing"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// A pause that lands while a producer's transaction is open — too late to
// mark the producer's messages, which it cannot see yet — holds them all
// the same: a claim never hands out a paused topic's message, even behind
// another topic's head on the same key.
func TestAPauseRacingACommitHoldsTheMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	producer := pgtest.Pool(t, db.LoginAs(t, "outbox_producer"))
	operator := pgtest.Pool(t, db.LoginAs(t, "outbox_operator"))
	dispatcher := pgtest.Pool(t, db.LoginAs(t, "outbox_dispatcher"))

	tx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	for _, topic := range []string{"orders.A", "refunds.B"} {
		if _, err := tx.Exec(ctx, `SELECT outbox.enqueue('shop', $1, '{"amount": 5}', p_ordering_key => 'acct-1')`, topic); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := operator.Exec(ctx, `SELECT outbox.pause('shop', 'refunds.B', 'ana', 'refund backlog on hold')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	rows, err := dispatcher.Query(ctx, `SELECT topic FROM outbox.claim_batch(100, 'w', 60, NULL, p_max_run => 100)`)
	if err != nil {
		t.Fatal(err)
	}
	var topics []string
	for rows.Next() {
		var topic string
		if err := rows.Scan(&topic); err != nil {
			t.Fatal(err)
		}
		topics = append(topics, topic)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(topics) != 1 || topics[0] != "orders.A" {
		t.Fatalf("claim while shop/refunds.B is paused returned %v, want [orders.A] alone", topics)
	}
}
