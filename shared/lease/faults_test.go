package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// Database faults inside a batch, against the real server: a claimer's
// connection killed between claim and complete, a completion that fails
// half-way through its statement, and statement timeouts. In every case the
// outcome must be all or nothing — never a message lost, never half a batch
// recorded — and the store must hand back an error that says what happened.

// backendPID is the server process behind conn.
func backendPID(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var pid int
	if err := conn.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

func terminate(t *testing.T, pool *pgxpool.Pool, pid int) {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1, 5000)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
	}
}

// states counts the rows in pending (leased or not), dead and the archive.
type states struct{ pending, leased, dead, attempts int }

func snapshot(t *testing.T, pool *pgxpool.Pool) states {
	t.Helper()
	var s states
	err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM outbox.pending),
		(SELECT count(*) FROM outbox.pending WHERE lease_token IS NOT NULL),
		(SELECT count(*) FROM outbox.dead), (SELECT count(*) FROM outbox.attempts)`).Scan(&s.pending, &s.leased, &s.dead, &s.attempts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ids(msgs []outboxtype.Message) []uuid.UUID {
	out := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func TestClaimerConnectionDroppedBetweenClaimAndComplete(t *testing.T) {
	t.Parallel()

	// The claim committed (the store runs in autocommit), then the
	// connection died: the rows stay leased to the worker, and the worker
	// completes them on a new connection while the lease holds.
	t.Run("completion on a new connection", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		ctx := context.Background()
		enqueue(t, db.Pool, 50, plain)
		claimer := pgtest.Connect(t, db.URL)
		msgs, err := lease.NewStore(claimer).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 50, Lease: time.Minute})
		if err != nil || len(msgs) != 50 {
			t.Fatalf("claim: %d, %v", len(msgs), err)
		}
		terminate(t, db.Pool, backendPID(t, claimer))
		if _, err := claimer.Exec(ctx, `SELECT 1`); err == nil {
			t.Fatal("the terminated connection still answers")
		}
		if s := snapshot(t, db.Pool); s.pending != 50 || s.leased != 50 || s.attempts != 0 {
			t.Fatalf("after the drop: %+v, want 50 leased and nothing recorded", s)
		}
		fresh := pgtest.Connect(t, db.URL)
		completions, err := lease.NewStore(fresh).CompleteBatch(ctx, "w", dispatched(msgs))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range completions {
			if c.Status != outboxtype.StatusOK {
				t.Fatalf("completion on the new connection: %s for %s", c.Status, c.ID)
			}
		}
		if s := snapshot(t, db.Pool); s.pending != 0 || s.attempts != 50 {
			t.Fatalf("after completing: %+v", s)
		}
	})

	// The connection died and nobody completes: the rows stay leased until
	// the lease expires, the reaper requeues them, another worker delivers
	// them, and the first worker's late completion is refused.
	t.Run("never completed, repaired after expiry", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		ctx := context.Background()
		enqueue(t, db.Pool, 50, plain)
		claimer := pgtest.Connect(t, db.URL)
		msgs, err := lease.NewStore(claimer).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w1", BatchSize: 50, Lease: time.Minute})
		if err != nil || len(msgs) != 50 {
			t.Fatalf("claim: %d, %v", len(msgs), err)
		}
		terminate(t, db.Pool, backendPID(t, claimer))

		store := lease.NewStore(db.Pool)
		if n, err := store.RepairExpiredLeases(ctx, "reaper", 1000); err != nil || n != 0 {
			t.Fatalf("the reaper took %d live leases (%v)", n, err)
		}
		if again, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w2", BatchSize: 50, Lease: time.Minute}); len(again) != 0 {
			t.Fatalf("%d leased messages claimed again before expiry", len(again))
		}
		expireLeases(t, db.Pool, ids(msgs)...)
		if n, err := store.RepairExpiredLeases(ctx, "reaper", 1000); err != nil || n != 50 {
			t.Fatalf("repair: %d, %v; want 50", n, err)
		}
		retaken, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w2", BatchSize: 50, Lease: time.Minute})
		if err != nil || len(retaken) != 50 {
			t.Fatalf("reclaim: %d, %v", len(retaken), err)
		}
		if _, err := store.CompleteBatch(ctx, "w2", dispatched(retaken)); err != nil {
			t.Fatal(err)
		}
		late, err := store.CompleteBatch(ctx, "w1", dispatched(msgs))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range late {
			if c.Status != outboxtype.StatusLeaseLost {
				t.Fatalf("the dropped worker's late completion: %s, want lease_lost", c.Status)
			}
		}
		s := snapshot(t, db.Pool)
		if s.pending != 0 || s.dead != 0 {
			t.Fatalf("after repair and redelivery: %+v", s)
		}
		if n := count(t, db.Pool, `SELECT count(DISTINCT message_id) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != 50 {
			t.Fatalf("%d messages dispatched, want all 50", n)
		}
		if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE'`); n != 50 {
			t.Fatalf("%d ZOMBIE_REQUEUE attempts, want 50", n)
		}
	})

	// A claim inside an explicit transaction that dies before COMMIT never
	// happened: the rows are claimable at once, with no attempt spent.
	t.Run("claim in an uncommitted transaction", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		ctx := context.Background()
		enqueue(t, db.Pool, 20, plain)
		claimer := pgtest.Connect(t, db.URL)
		pid := backendPID(t, claimer)
		tx, err := claimer.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := lease.NewStore(tx).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w1", BatchSize: 20, Lease: time.Minute})
		if err != nil || len(msgs) != 20 {
			t.Fatalf("claim: %d, %v", len(msgs), err)
		}
		terminate(t, db.Pool, pid)
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("COMMIT succeeded on a terminated connection")
		}
		retaken, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w2", BatchSize: 20, Lease: time.Minute})
		if err != nil || len(retaken) != 20 {
			t.Fatalf("reclaim after the rolled-back claim: %d, %v", len(retaken), err)
		}
		for _, m := range retaken {
			if m.Attempt != 1 {
				t.Fatalf("message %s on attempt %d: the rolled-back claim spent an attempt", m.ID, m.Attempt)
			}
		}
	})
}

// failOnNthAttempt installs, in this test's private database, a trigger
// that makes the nth row inserted into outbox.attempts fail with how —
// "disk_full" raises SQLSTATE 53100 (as a failed file extension would),
// "slow" sleeps past any short statement_timeout.
func failOnNthAttempt(t *testing.T, pool *pgxpool.Pool, n int, how string) {
	t.Helper()
	body := `RAISE EXCEPTION 'injected: could not extend file (attempts row %)', v USING ERRCODE = 'disk_full';`
	if how == "slow" {
		body = `PERFORM pg_sleep(30);`
	}
	for _, stmt := range []string{
		`CREATE SEQUENCE public.attempt_inserts`,
		// SECURITY DEFINER: the outbox functions that insert run as
		// outbox_owner, which has no rights on this test's sequence.
		fmt.Sprintf(`CREATE FUNCTION public.fail_nth_attempt() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
		DECLARE v bigint := nextval('public.attempt_inserts');
		BEGIN
			IF v = %d THEN %s END IF;
			RETURN NEW;
		END $$`, n, body),
		`CREATE TRIGGER fail_nth_attempt BEFORE INSERT ON outbox.attempts FOR EACH ROW EXECUTE FUNCTION public.fail_nth_attempt()`,
	} {
		if _, err := pool.Exec(context.Background(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

func TestCompleteBatchFailingHalfwayRollsBackWhole(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, how string
		timeout   string // statement_timeout of the completing connection
		code      string
	}{
		{"an error on the 5th archived outcome", "disk_full", "", "53100"},
		{"statement_timeout hit on the 5th archived outcome", "slow", "300ms", "57014"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ctx := context.Background()
			enqueue(t, db.Pool, 12, plain)
			failOnNthAttempt(t, db.Pool, 5, tc.how)

			conn := pgtest.Connect(t, db.URL)
			if tc.timeout != "" {
				if _, err := conn.Exec(ctx, `SET statement_timeout = '`+tc.timeout+`'`); err != nil {
					t.Fatal(err)
				}
			}
			store := lease.NewStore(conn)
			msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 12, Lease: time.Minute})
			if err != nil || len(msgs) != 12 {
				t.Fatalf("claim: %d, %v", len(msgs), err)
			}
			// Every kind of outcome in one batch: deliveries, retries and
			// terminal failures, so that each table would be written.
			results := dispatched(msgs)
			for i := range results {
				switch i % 3 {
				case 1:
					results[i].Outcome, results[i].ErrorCode, results[i].RetryAt = outboxtype.OutcomeRetryable, "TARGET_5XX", time.Now().Add(time.Minute)
				case 2:
					results[i].Outcome, results[i].ErrorCode = outboxtype.OutcomeFailed, "TARGET_REJECTED"
				}
			}
			before := snapshot(t, db.Pool)
			_, err = store.CompleteBatch(ctx, "w", results)
			var lerr *lease.Error
			var pgErr *pgconn.PgError
			if !errors.As(err, &lerr) || lerr.Op != "complete" || lerr.Kind != nil || !errors.As(err, &pgErr) || pgErr.Code != tc.code {
				t.Fatalf("CompleteBatch: %v, want an unclassified *lease.Error (complete) carrying SQLSTATE %s", err, tc.code)
			}
			// All or nothing: the whole batch is still leased, under the same
			// tokens, nothing archived, nothing dead, nothing rescheduled.
			if after := snapshot(t, db.Pool); after != before || after.leased != 12 {
				t.Fatalf("a failed completion changed the tables: %+v, before %+v", after, before)
			}
			for _, m := range msgs {
				if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE id = $1 AND lease_token = $2 AND claimed_by = 'w' AND last_error IS NULL`, m.ID, m.LeaseToken); n != 1 {
					t.Fatalf("message %s lost its lease or was touched", m.ID)
				}
			}
			// The connection is usable again (autocommit: the failed
			// statement rolled back alone).
			if _, err := conn.Exec(ctx, `SELECT 1`); err != nil || conn.PgConn().TxStatus() != 'I' {
				t.Fatalf("connection after the failed completion: %v, transaction status %c", err, conn.PgConn().TxStatus())
			}

			// The worker is gone; the leases expire; the reaper requeues;
			// another worker delivers. Nothing is lost.
			expireLeases(t, db.Pool, ids(msgs)...)
			reaper := lease.NewStore(db.Pool)
			if n, err := reaper.RepairExpiredLeases(ctx, "reaper", 100); err != nil || n != 12 {
				t.Fatalf("repair: %d, %v; want 12", n, err)
			}
			retaken, err := reaper.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w2", BatchSize: 100, Lease: time.Minute})
			if err != nil || len(retaken) != 12 {
				t.Fatalf("reclaim: %d, %v", len(retaken), err)
			}
			if _, err := reaper.CompleteBatch(ctx, "w2", dispatched(retaken)); err != nil {
				t.Fatal(err)
			}
			if s := snapshot(t, db.Pool); s.pending != 0 || s.dead != 0 {
				t.Fatalf("after repair: %+v", s)
			}
			if n := count(t, db.Pool, `SELECT count(DISTINCT message_id) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != 12 {
				t.Fatalf("%d of 12 messages dispatched", n)
			}
		})
	}
}

func TestClaimHonoursStatementTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	enqueue(t, db.Pool, 10, plain)

	// Someone holds the table (a migration, a VACUUM FULL, a careless
	// LOCK): a claim waits for the lock, and statement_timeout ends it.
	locker := pgtest.Connect(t, db.URL)
	lockTx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lockTx.Rollback(ctx)
	if _, err := lockTx.Exec(ctx, `LOCK TABLE outbox.pending IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	conn := pgtest.Connect(t, db.URL)
	if _, err := conn.Exec(ctx, `SET statement_timeout = '200ms'`); err != nil {
		t.Fatal(err)
	}
	store := lease.NewStore(conn)
	claim := func() ([]outboxtype.Message, time.Duration, error) {
		started := time.Now()
		msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
		return msgs, time.Since(started), err
	}
	mustTimeOut := func(t *testing.T, err error, took time.Duration) {
		t.Helper()
		var lerr *lease.Error
		var pgErr *pgconn.PgError
		if !errors.As(err, &lerr) || lerr.Op != "claim" || lerr.Kind != nil || !errors.As(err, &pgErr) || pgErr.Code != "57014" {
			t.Fatalf("claim against a locked table: %v, want an unclassified *lease.Error (claim) carrying 57014", err)
		}
		// Generous: the point is that it returns at all, not how fast.
		if took > 15*time.Second {
			t.Fatalf("the claim took %s with a 200ms statement_timeout", took)
		}
	}

	t.Run("autocommit", func(t *testing.T) {
		msgs, took, err := claim()
		if len(msgs) != 0 {
			t.Fatalf("claimed %d messages through a lock", len(msgs))
		}
		mustTimeOut(t, err, took)
		if _, err := conn.Exec(ctx, `SELECT 1`); err != nil || conn.PgConn().TxStatus() != 'I' {
			t.Fatalf("connection after the timeout: %v, status %c", err, conn.PgConn().TxStatus())
		}
	})

	t.Run("inside a transaction", func(t *testing.T) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = lease.NewStore(tx).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
		mustTimeOut(t, err, 0)
		// The transaction is failed, visibly, until it is rolled back; then
		// the connection is clean.
		if conn.PgConn().TxStatus() != 'E' {
			t.Fatalf("transaction status %c after the timeout, want E (failed)", conn.PgConn().TxStatus())
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `SELECT 1`); err != nil || conn.PgConn().TxStatus() != 'I' {
			t.Fatalf("connection after rollback: %v, status %c", err, conn.PgConn().TxStatus())
		}
	})

	t.Run("nothing claimed, and the lock released the claim goes through", func(t *testing.T) {
		if err := lockTx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if s := snapshot(t, db.Pool); s.leased != 0 || s.attempts != 0 {
			t.Fatalf("timed-out claims left %+v", s)
		}
		msgs, _, err := claim()
		if err != nil || len(msgs) != 10 {
			t.Fatalf("claim after the lock: %d, %v", len(msgs), err)
		}
		for _, m := range msgs {
			if m.Attempt != 1 {
				t.Fatalf("message %s on attempt %d after timed-out claims", m.ID, m.Attempt)
			}
		}
	})

	// Row locks are another matter: SKIP LOCKED passes over rows another
	// transaction holds, without waiting for the timeout.
	t.Run("row locks are skipped, not waited for", func(t *testing.T) {
		db := pgtest.New(t)
		enqueue(t, db.Pool, 10, plain)
		holder := pgtest.Connect(t, db.URL)
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT id FROM outbox.pending ORDER BY next_attempt_at, id LIMIT 4 FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		c := pgtest.Connect(t, db.URL)
		if _, err := c.Exec(ctx, `SET statement_timeout = '2s'`); err != nil {
			t.Fatal(err)
		}
		msgs, err := lease.NewStore(c).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
		if err != nil || len(msgs) != 6 {
			t.Fatalf("claim next to 4 locked rows: %d, %v; want the 6 free ones at once", len(msgs), err)
		}
	})
}
