package migrations_test

import (
	"context"
	"fmt"
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

// A completion sent while its lease is live but held up by a row lock of
// someone else's records nothing once the lease has run out: not the run's
// head (whose own row PostgreSQL re-checks after the wait), not the run's
// other messages (checked through the head), not an unordered message whose
// lease simply expired meanwhile. A claim meanwhile does not wait for the
// completion, and the two cannot deadlock; once the completion gave up, the
// next claim takes the run over and records it, each attempt of each message
// ended once.
func TestAStaleCompletionHeldUpByALockWritesNothing(t *testing.T) {
	t.Parallel()
	for _, held := range []struct {
		name string
		rows func(a []claimed) []uuid.UUID
	}{
		{"every row held", func(a []claimed) []uuid.UUID {
			ids := make([]uuid.UUID, len(a))
			for i, c := range a {
				ids[i] = c.id
			}
			return ids
		}},
		// The run's head is free, so a claim may take the run over while
		// the completion waits behind the run's second message.
		{"a run's second message held", func(a []claimed) []uuid.UUID {
			for _, c := range a {
				if c.key == "acct-z" && c.seq == 2 {
					return []uuid.UUID{c.id}
				}
			}
			return nil
		}},
	} {
		t.Run(held.name, func(t *testing.T) {
			t.Parallel()
			staleCompletionHeldUp(t, held.rows)
		})
	}
}

func staleCompletionHeldUp(t *testing.T, heldRows func([]claimed) []uuid.UUID) {
	ctx := context.Background()
	db := pgtest.New(t)
	workerA := pgtest.Pool(t, db.LoginAs(t, "outbox_dispatcher"))
	workerB := pgtest.Pool(t, db.LoginAs(t, "outbox_dispatcher"))

	if _, err := db.Pool.Exec(ctx, `
		SELECT outbox.enqueue('shop', 'payment', jsonb_build_object('n', g), p_ordering_key => 'acct-z') FROM generate_series(1, 3) g;
		SELECT outbox.enqueue('shop', 'payment', '{"n": 4}', p_ordering_key => 'k2');
		SELECT outbox.enqueue('shop', 'payment', '{"n": 5}');`); err != nil {
		t.Fatal(err)
	}
	const leaseSeconds = 2
	a := claimAs(t, ctx, workerA, "worker-a", leaseSeconds)
	if len(a) != 5 {
		t.Fatalf("worker A claimed %d messages, want all 5", len(a))
	}

	// Rows held by another session (FOR KEY SHARE, which a delete waits
	// for and an update of a takeover does not).
	locker, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx) //nolint:errcheck
	ids := make([]uuid.UUID, len(a))
	tokens := make([]uuid.UUID, len(a))
	for i, c := range a {
		ids[i], tokens[i] = c.id, c.token
	}
	if _, err := locker.Exec(ctx, `SELECT 1 FROM outbox.pending WHERE id = ANY ($1) FOR KEY SHARE`, heldRows(a)); err != nil {
		t.Fatal(err)
	}

	type answer struct {
		statuses map[uuid.UUID]string
		err      error
	}
	done := make(chan answer, 1)
	go func() {
		rows, err := workerA.Query(ctx, `SELECT id, status FROM outbox.complete_batch('worker-a', NULL, 100, false,
			p_ids => $1, p_lease_tokens => $2, p_outcomes => array_fill('DISPATCHED'::text, ARRAY[5]))`, ids, tokens)
		if err != nil {
			done <- answer{err: err}
			return
		}
		statuses := map[uuid.UUID]string{}
		for rows.Next() {
			var id uuid.UUID
			var status string
			if err := rows.Scan(&id, &status); err != nil {
				done <- answer{err: err}
				return
			}
			statuses[id] = status
		}
		done <- answer{statuses: statuses, err: rows.Err()}
	}()
	waitUntil(t, ctx, db.Pool, "worker A's completion waiting for a lock",
		`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%complete_batch(''worker-a''%')`)
	latest := a[0].expires
	for _, c := range a {
		if c.expires.After(latest) {
			latest = c.expires
		}
	}
	waitUntil(t, ctx, db.Pool, "the lease to expire", `SELECT clock_timestamp() > $1`, latest)

	// A claim meanwhile: it takes over what nobody holds, and waits for
	// nothing.
	claimDone := make(chan []claimed, 1)
	go func() { claimDone <- claimAs(t, ctx, workerB, "worker-b", 60) }()
	var takenOver []claimed
	select {
	case takenOver = <-claimDone:
	case got := <-done:
		t.Fatalf("worker A's completion finished while the lock was held: %+v", got)
	case <-time.After(2 * time.Minute):
		t.Fatal("worker B's claim waited for the held-up completion")
	}

	if err := locker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatalf("worker A's completion: %v (a completion and a claim must not deadlock)", got.err)
	}
	for _, c := range a {
		if s := got.statuses[c.id]; s != "lease_lost" {
			t.Errorf("worker A's stale completion of %s#%d: %s, want lease_lost (its lease ran out while it waited)", c.key, c.seq, s)
		}
	}
	var byA int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox.attempts WHERE worker_id = 'worker-a' AND state = 'DISPATCHED'`).Scan(&byA); err != nil || byA != 0 {
		t.Fatalf("%d outcomes archived for worker A (%v), want none", byA, err)
	}

	// Whatever worker B took over is B's; the next claims take the rest, and
	// recording them ends each message's attempts once.
	for round := 0; round < 3; round++ {
		b := takenOver
		if round > 0 {
			b = claimAs(t, ctx, workerB, "worker-b", 60)
		}
		if len(b) == 0 && round > 0 {
			break
		}
		bids := make([]uuid.UUID, len(b))
		btokens := make([]uuid.UUID, len(b))
		for i, c := range b {
			bids[i], btokens[i] = c.id, c.token
		}
		var notOK int
		if err := workerB.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status <> 'ok') FROM outbox.complete_batch('worker-b', NULL, 100, false,
			p_ids => $1, p_lease_tokens => $2, p_outcomes => array_fill('DISPATCHED'::text, ARRAY[$3::int]))`, bids, btokens, len(b)).Scan(&notOK); err != nil || notOK != 0 {
			t.Fatalf("worker B's completion: %d not ok (%v)", notOK, err)
		}
	}
	var pending, dispatched int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox.pending),
		(SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED' AND worker_id = 'worker-b')`).Scan(&pending, &dispatched); err != nil {
		t.Fatal(err)
	}
	if pending != 0 || dispatched != 5 {
		t.Fatalf("after worker B: %d pending, %d dispatched by B, want 0 and 5", pending, dispatched)
	}
	assertEachAttemptEndsOnce(t, ctx, db.Pool)
}

// assertEachAttemptEndsOnce fails the test when an attempt of a message
// (message_id, attempt_no) has more than one ending in the archive: an
// outcome recorded by a worker whose lease another had taken over.
func assertEachAttemptEndsOnce(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT message_id, attempt_no, string_agg(state || ' by ' || coalesce(worker_id, '?'), ', ' ORDER BY id)
		FROM outbox.attempts WHERE state IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'ZOMBIE_REQUEUE')
		GROUP BY message_id, attempt_no HAVING count(*) > 1`)
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	for rows.Next() {
		var id uuid.UUID
		var attempt int
		var endings string
		if err := rows.Scan(&id, &attempt, &endings); err != nil {
			t.Fatal(err)
		}
		problems = append(problems, fmt.Sprintf("message %s attempt %d ended %s", id, attempt, endings))
	}
	if len(problems) > 0 {
		t.Fatalf("attempts ended more than once:\n%s", strings.Join(problems, "\n"))
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
