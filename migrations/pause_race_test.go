package migrations_test

import (
	"context"
	"testing"
	"time"

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

// A dead letter replayed while its key's head is in flight goes first once
// that head is given back, whether the head was rescheduled after a
// failure or its lease was taken over: the key's next claim starts with it,
// not with the head it was replayed behind.
func TestAReplayedMessageGoesBeforeTheHeadItWaitedBehind(t *testing.T) {
	t.Parallel()
	for _, giveBack := range []string{"rescheduled", "taken over"} {
		t.Run(giveBack, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)
			if _, err := db.Pool.Exec(ctx, `SELECT outbox.enqueue('shop', 'payment', jsonb_build_object('n', g), p_ordering_key => 'k') FROM generate_series(1, 3) g`); err != nil {
				t.Fatal(err)
			}
			// Message 1 dies (on_dead skip), so that message 2 is the head.
			var one, oneToken string
			if err := db.Pool.QueryRow(ctx, `SELECT id, lease_token FROM outbox.claim_batch(10, 'a', 60, NULL, 1)`).Scan(&one, &oneToken); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Pool.Exec(ctx, `SELECT outbox.complete_batch('a', NULL, 100, false, ARRAY[$1::uuid], ARRAY[$2::uuid], ARRAY['FAILED'], p_on_dead => ARRAY['skip'])`, one, oneToken); err != nil {
				t.Fatal(err)
			}
			lease := 60
			if giveBack == "taken over" {
				lease = 1
			}
			var two, twoToken string
			var expires time.Time
			if err := db.Pool.QueryRow(ctx, `SELECT id, lease_token, lease_expires_at FROM outbox.claim_batch(10, 'b', $1, NULL, 1)`, lease).Scan(&two, &twoToken, &expires); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Pool.Exec(ctx, `SELECT outbox.replay_dead(ARRAY[$1::uuid], p_dry_run => false, p_reason => 'retry')`, one); err != nil {
				t.Fatal(err)
			}
			if giveBack == "rescheduled" {
				if _, err := db.Pool.Exec(ctx, `SELECT outbox.complete_batch('b', NULL, 100, false, ARRAY[$1::uuid], ARRAY[$2::uuid], ARRAY['RETRYABLE'], p_retry_at => ARRAY[now()])`, two, twoToken); err != nil {
					t.Fatal(err)
				}
			} else {
				waitUntil(t, ctx, db.Pool, "the lease to expire", `SELECT clock_timestamp() > $1`, expires)
				if _, err := db.Pool.Exec(ctx, `SELECT outbox.repair_expired_leases(100, 'reaper')`); err != nil {
					t.Fatal(err)
				}
			}
			var seqs []int64
			rows, err := db.Pool.Query(ctx, `SELECT sequence_id FROM outbox.claim_batch(10, 'c', 60, NULL, 10)`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var s int64
				if err := rows.Scan(&s); err != nil {
					t.Fatal(err)
				}
				seqs = append(seqs, s)
			}
			if len(seqs) == 0 || seqs[0] != 1 {
				t.Fatalf("the key's next claim after its head was %s: sequence ids %v, want the replayed 1 first", giveBack, seqs)
			}
		})
	}
}
