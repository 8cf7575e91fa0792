package migrations_test

import (
	"context"
	"testing"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// Defect 3: a message committed after its topic was paused, behind the
// head of another topic on its key, must not be claimed with the head's
// run.
func TestPausedTopicNotClaimedInARun(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	producer, _ := defectLogin(t, db, "outbox_producer")
	operator, _ := defectLogin(t, db, "outbox_operator")
	dispatcher, _ := defectLogin(t, db, "outbox_dispatcher")

	tx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	for _, topic := range []string{"orders.A", "refunds.B"} {
		if _, err := tx.Exec(ctx, `SELECT * FROM outbox.enqueue('shop', $1, '{"amount": 5}', p_ordering_key => 'acct-1')`, topic); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := operator.Exec(ctx, `SELECT outbox.pause('shop', 'refunds.B', 'ops', 'refunds on hold')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	claimed, err := defectClaim(ctx, dispatcher, "w", 60, 100)
	if err != nil {
		t.Fatal(err)
	}
	var topics []string
	for _, c := range claimed {
		topics = append(topics, c.topic)
		if c.topic == "refunds.B" {
			t.Errorf("claimed %s seq %d of paused topic shop/refunds.B (paused before its producer committed)", c.key, c.seq)
		}
	}
	if len(claimed) == 0 || claimed[0].topic != "orders.A" {
		t.Errorf("claimed %v, want orders.A, the unpaused head of acct-1", topics)
	}
}
