package migrations_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// claimed is one row a claim returned.
type claimed struct {
	id           uuid.UUID
	key          string
	seq          int64
	token        uuid.UUID
	expires      time.Time
	attemptCount int
}

func claimAs(t *testing.T, ctx context.Context, pool *pgxpool.Pool, worker string, leaseSeconds int) []claimed {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT id, coalesce(ordering_key, ''), coalesce(sequence_id, 0), lease_token, lease_expires_at, attempt_count
		FROM outbox.claim_batch(100, $1, $2, NULL, 10) ORDER BY ordering_key, sequence_id`, worker, leaseSeconds)
	if err != nil {
		t.Fatalf("claim as %s: %v", worker, err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
		var c claimed
		err := r.Scan(&c.id, &c.key, &c.seq, &c.token, &c.expires, &c.attemptCount)
		return c, err
	})
	if err != nil {
		t.Fatalf("claim as %s: %v", worker, err)
	}
	return got
}

// waitUntil polls cond (a query answering one boolean) until it is true;
// the ceiling is generous, since a busy machine is slow, not wrong.
func waitUntil(t *testing.T, ctx context.Context, pool *pgxpool.Pool, what, cond string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var ok bool
		if err := pool.QueryRow(ctx, cond, args...).Scan(&ok); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within two minutes", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A run taken over after its lease ran out says why on every message of
// it, not only on its head: operators list them as failed once, with the
// error, not as "1 attempt, no error".
func TestATakenOverRunSaysWhyOnEveryMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	if _, err := db.Pool.Exec(ctx, `SELECT outbox.enqueue('shop', 'payment', jsonb_build_object('n', g), p_ordering_key => 'acct-1') FROM generate_series(1, 3) g`); err != nil {
		t.Fatal(err)
	}
	run := claimAs(t, ctx, db.Pool, "worker-a", 1)
	if len(run) != 3 {
		t.Fatalf("claimed %d messages, want the run of 3", len(run))
	}
	waitUntil(t, ctx, db.Pool, "the lease to expire", `SELECT clock_timestamp() > $1`, run[0].expires)
	var repaired int
	if err := db.Pool.QueryRow(ctx, `SELECT outbox.repair_expired_leases(100, 'reaper')`).Scan(&repaired); err != nil || repaired != 3 {
		t.Fatalf("repair: %d (%v), want the run of 3", repaired, err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT sequence_id, attempt_count, coalesce(last_error_code, ''), coalesce(last_error, '')
		FROM outbox.pending WHERE ordering_key = 'acct-1' ORDER BY sequence_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var seq int64
		var attempts int
		var code, msg string
		if err := rows.Scan(&seq, &attempts, &code, &msg); err != nil {
			t.Fatal(err)
		}
		if attempts != 1 || code != "LEASE_EXPIRED" || !strings.Contains(msg, "worker-a") {
			t.Errorf("acct-1#%d after the takeover: %d attempts, error %q %q; want 1 attempt, LEASE_EXPIRED naming worker-a", seq, attempts, code, msg)
		}
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
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
