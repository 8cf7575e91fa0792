package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// enqueue writes n messages built by build(i) in batches.
func enqueue(t testing.TB, pool *pgxpool.Pool, n int, build func(i int) outbox.Message) []outbox.Enqueued {
	t.Helper()
	var out []outbox.Enqueued
	for start := 0; start < n; start += 1000 {
		var batch []outbox.Message
		for i := start; i < min(n, start+1000); i++ {
			batch = append(batch, build(i))
		}
		res, err := outbox.EnqueueBatch(context.Background(), pool, batch)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, res...)
	}
	return out
}

func plain(i int) outbox.Message {
	return outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// expireLeases moves the given messages' lease expiry into the past, as if
// the lease's time had run out, so tests never sleep for it.
func expireLeases(t testing.TB, pool *pgxpool.Pool, ids ...uuid.UUID) {
	t.Helper()
	// A run's messages hold their head's lease (see claim_batch): the
	// leases among ids are the ones to expire.
	if _, err := pool.Exec(context.Background(), `UPDATE outbox.pending SET lease_expires_at = now() - interval '1 second' WHERE id = ANY($1) AND lease_token IS NOT NULL`, ids); err != nil {
		t.Fatal(err)
	}
}

// makeDue moves the given messages' next attempt to now.
func makeDue(t testing.TB, pool *pgxpool.Pool, ids ...uuid.UUID) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE outbox.pending SET next_attempt_at = now() WHERE id = ANY($1)`, ids); err != nil {
		t.Fatal(err)
	}
}

// age moves every timestamp of the archive and the dedupe keys back by d,
// as if that long had passed (the archive's append-only trigger is set
// aside for it: only this test's superuser can).
func age(t testing.TB, pool *pgxpool.Pool, d time.Duration) {
	t.Helper()
	for _, stmt := range []string{
		`ALTER TABLE outbox.attempts DISABLE TRIGGER attempts_append_only`,
		`UPDATE outbox.attempts SET created_at = created_at - $1::interval`,
		`ALTER TABLE outbox.attempts ENABLE TRIGGER attempts_append_only`,
		`UPDATE outbox.dedupe SET created_at = created_at - $1::interval, settled_at = settled_at - $1::interval`,
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

func dispatched(msgs []outboxtype.Message) []lease.Result {
	out := make([]lease.Result, len(msgs))
	for i, m := range msgs {
		out[i] = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeDispatched, Target: "test", TargetRef: "ref-" + m.ID.String()}
	}
	return out
}

func TestConcurrentClaimersDeliverEachMessageOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 10 })
	ctx := context.Background()
	const total = 20_000
	enqueue(t, db.Pool, total, plain)

	var (
		mu         sync.Mutex
		deliveries = make(map[uuid.UUID]int, total)
		wg         sync.WaitGroup
		errs       = make(chan error, 8)
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := db.Pool.Acquire(ctx) // a connection of its own
			if err != nil {
				errs <- err
				return
			}
			defer conn.Release()
			store := lease.NewStore(conn)
			worker := fmt.Sprintf("worker-%d", w)
			for {
				msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: worker, BatchSize: 100, Lease: 5 * time.Minute})
				if err != nil {
					errs <- err
					return
				}
				if len(msgs) == 0 {
					return
				}
				mu.Lock()
				for _, m := range msgs {
					deliveries[m.ID]++
				}
				mu.Unlock()
				completions, err := store.CompleteBatch(ctx, worker, dispatched(msgs))
				if err != nil {
					errs <- err
					return
				}
				for _, c := range completions {
					if c.Status != outboxtype.StatusOK {
						errs <- fmt.Errorf("%s: completion of %s: %s", worker, c.ID, c.Status)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(deliveries) != total {
		t.Fatalf("%d distinct messages delivered, want %d", len(deliveries), total)
	}
	for id, n := range deliveries {
		if n != 1 {
			t.Fatalf("message %s delivered %d times", id, n)
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`); n != 0 {
		t.Fatalf("%d messages left pending", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != total {
		t.Fatalf("%d DISPATCHED attempts archived, want %d", n, total)
	}
}

func TestFencingRejectsStaleWorker(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 1, plain)

	stale, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "worker-a", BatchSize: 10, Lease: time.Minute})
	if err != nil || len(stale) != 1 {
		t.Fatalf("claim a: %v (%d)", err, len(stale))
	}
	// While the lease holds, nobody else gets the message.
	if other, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "worker-b", BatchSize: 10, Lease: time.Minute}); len(other) != 0 {
		t.Fatalf("worker-b claimed %d leased messages", len(other))
	}

	expireLeases(t, db.Pool, stale[0].ID)
	// Even the holder cannot complete after expiry.
	if c, err := store.CompleteBatch(ctx, "worker-a", dispatched(stale)); err != nil || c[0].Status != outboxtype.StatusLeaseLost {
		t.Fatalf("completion after expiry: %v %v, want lease_lost", c, err)
	}
	repaired, err := store.RepairExpiredLeases(ctx, "reaper", 100)
	if err != nil || repaired != 1 {
		t.Fatalf("repair: %d, %v; want 1", repaired, err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE' AND message_id = $1 AND worker_id = 'reaper' AND error_code = 'LEASE_EXPIRED'`, stale[0].ID); n != 1 {
		t.Fatalf("%d ZOMBIE_REQUEUE attempts, want 1", n)
	}

	fresh, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "worker-b", BatchSize: 10, Lease: time.Minute})
	if err != nil || len(fresh) != 1 || fresh[0].ID != stale[0].ID {
		t.Fatalf("claim b: %v %v", fresh, err)
	}
	if fresh[0].LeaseToken == stale[0].LeaseToken || fresh[0].Attempt != 2 {
		t.Fatalf("reclaim got token %s attempt %d; want a fresh token and attempt 2", fresh[0].LeaseToken, fresh[0].Attempt)
	}

	attemptsBefore := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts`)
	c, err := store.CompleteBatch(ctx, "worker-a", dispatched(stale))
	if err != nil || len(c) != 1 || c[0].Status != outboxtype.StatusLeaseLost {
		t.Fatalf("stale batch completion: %v %v, want lease_lost", c, err)
	}
	// The stale worker's own id with the new holder's token is refused too.
	stolen := dispatched(fresh)
	if c, err := store.CompleteBatch(ctx, "worker-a", stolen); err != nil || c[0].Status != outboxtype.StatusLeaseLost {
		t.Fatalf("completion under another worker's token: %v %v", c, err)
	}
	_, err = store.Complete(ctx, "worker-a", dispatched(stale)[0])
	if !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("stale single completion: %v, want ErrLeaseLost", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "P7002" {
		t.Fatalf("stale single completion does not carry P7002: %v", err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts`); n != attemptsBefore {
		t.Fatalf("stale completions wrote %d attempts", n-attemptsBefore)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE claimed_by = 'worker-b' AND lease_token = $1`, fresh[0].LeaseToken); n != 1 {
		t.Fatal("stale completions disturbed the new holder's lease")
	}

	if status, err := store.Complete(ctx, "worker-b", dispatched(fresh)[0]); err != nil || status != outboxtype.StatusOK {
		t.Fatalf("holder's completion: %s %v", status, err)
	}
	// A second completion by the same holder is a lost lease, not a second delivery.
	if _, err := store.Complete(ctx, "worker-b", dispatched(fresh)[0]); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("double completion: %v, want ErrLeaseLost", err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != 1 {
		t.Fatalf("%d DISPATCHED attempts, want 1", n)
	}
}

func TestRetryReschedulesThenDeadLetters(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	policy := backoff.Policy{MaxAttempts: 5, BaseDelay: 2 * time.Second, MaxDelay: 10 * time.Second}
	// Pin the jitter to its ceiling so that every delay is the bound itself.
	ceiling := func(d time.Duration) time.Duration { return d }
	id := enqueue(t, db.Pool, 1, plain)[0].ID

	var previous time.Time
	for attempt := 1; ; attempt++ {
		msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
		if err != nil || len(msgs) != 1 {
			t.Fatalf("attempt %d: claim %v (%d)", attempt, err, len(msgs))
		}
		m := msgs[0]
		if m.Attempt != attempt {
			t.Fatalf("claim reports attempt %d, want %d", m.Attempt, attempt)
		}
		now := time.Now()
		r := lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeRetryable, ErrorCode: "TARGET_5XX", ErrorMessage: fmt.Sprintf("503 on attempt %d", attempt)}
		retryAt, err := policy.Next(now, m.Attempt, 0, ceiling)
		if errors.Is(err, backoff.ErrExhausted) {
			r.Outcome = outboxtype.OutcomeFailed
		} else {
			r.RetryAt = retryAt
		}
		if _, err := store.CompleteBatch(ctx, "w", []lease.Result{r}); err != nil {
			t.Fatal(err)
		}
		if r.Outcome == outboxtype.OutcomeFailed {
			if attempt != policy.MaxAttempts {
				t.Fatalf("dead after attempt %d, want %d", attempt, policy.MaxAttempts)
			}
			break
		}
		var next time.Time
		var lastErr, lastCode string
		if err := db.Pool.QueryRow(ctx, `SELECT next_attempt_at, last_error, last_error_code FROM outbox.pending WHERE id = $1 AND lease_token IS NULL`, id).Scan(&next, &lastErr, &lastCode); err != nil {
			t.Fatal(err)
		}
		bound := policy.Ceiling(attempt)
		if d := next.Sub(now); d < bound-time.Millisecond || d > bound+time.Millisecond {
			t.Fatalf("attempt %d rescheduled %s ahead, want the ceiling %s", attempt, d, bound)
		}
		if !next.After(previous) {
			t.Fatalf("attempt %d next_attempt_at %s not after the previous %s", attempt, next, previous)
		}
		if lastErr != r.ErrorMessage || lastCode != "TARGET_5XX" {
			t.Fatalf("last error %q/%q not recorded", lastCode, lastErr)
		}
		previous = next
		// Not due yet: nobody may claim it early.
		if early, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute}); len(early) != 0 {
			t.Fatalf("claimed before its retry time")
		}
		makeDue(t, db.Pool, id)
	}

	var code, message string
	var attempts int
	if err := db.Pool.QueryRow(ctx, `SELECT last_error_code, last_error, attempt_count FROM outbox.dead WHERE id = $1`, id).Scan(&code, &message, &attempts); err != nil {
		t.Fatalf("not in dead: %v", err)
	}
	if code != "TARGET_5XX" || attempts != policy.MaxAttempts {
		t.Fatalf("dead letter code %q attempts %d", code, attempts)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`); n != 0 {
		t.Fatalf("dead message still pending")
	}
	if msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute}); len(msgs) != 0 {
		t.Fatalf("a dead message was claimed")
	}
	want := []string{"RETRYABLE", "RETRYABLE", "RETRYABLE", "RETRYABLE", "FAILED"}
	rows, _ := db.Pool.Query(ctx, `SELECT state FROM outbox.attempts WHERE message_id = $1 ORDER BY id`, id)
	var got []string
	for rows.Next() {
		var s string
		rows.Scan(&s)
		got = append(got, s)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("attempt history %v, want %v", got, want)
	}
}

func TestJitteredRetriesStayWithinPolicy(t *testing.T) {
	t.Parallel()
	policy := backoff.Policy{MaxAttempts: 12, BaseDelay: time.Second, MaxDelay: time.Minute}
	now := time.Unix(1_800_000_000, 0)
	for attempt := 1; attempt < policy.MaxAttempts; attempt++ {
		for range 200 {
			at, err := policy.Next(now, attempt, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if d := at.Sub(now); d < 0 || d > policy.Ceiling(attempt) {
				t.Fatalf("attempt %d: delay %s outside [0, %s]", attempt, d, policy.Ceiling(attempt))
			}
		}
	}
}

func TestAttemptCeilingDeadLettersRetryable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	store.AttemptCeiling = 2
	id := enqueue(t, db.Pool, 1, plain)[0].ID
	for attempt := 1; attempt <= 2; attempt++ {
		msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
		c, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: outboxtype.OutcomeRetryable, ErrorCode: "THROTTLED"}})
		if err != nil {
			t.Fatal(err)
		}
		want := outboxtype.StatusOK
		if attempt == 2 {
			want = outboxtype.StatusDead
		}
		if c[0].Status != want {
			t.Fatalf("attempt %d: status %s, want %s", attempt, c[0].Status, want)
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead WHERE id = $1 AND last_error_code = 'THROTTLED'`, id); n != 1 {
		t.Fatal("message at the ceiling is not dead")
	}
}

// The SQL functions' default ceiling, for callers that pass none, is the
// one the store passes when it is not configured. (The callers' functions
// are the SECURITY DEFINER ones; those they call inside are given the
// ceiling.)
func TestSQLDefaultAttemptCeilingIsTheStores(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rows, err := db.Pool.Query(context.Background(), `
		SELECT p.proname, pg_get_function_arguments(p.oid) FROM pg_proc p
		JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'outbox' AND p.prosecdef AND pg_get_function_arguments(p.oid) LIKE '%p_max_attempts%'`)
	if err != nil {
		t.Fatal(err)
	}
	var functions []string
	want := fmt.Sprintf("p_max_attempts integer DEFAULT %d", outboxtype.DefaultAttemptCeiling)
	for rows.Next() {
		var name, args string
		if err := rows.Scan(&name, &args); err != nil {
			t.Fatal(err)
		}
		functions = append(functions, name)
		if !strings.Contains(args, want) {
			t.Errorf("outbox.%s(%s): want %s", name, args, want)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(functions)
	if !slices.Equal(functions, []string{"claim_batch", "complete", "complete_batch", "repair_expired_leases"}) {
		t.Errorf("functions with p_max_attempts: %v", functions)
	}
}

func TestRepairDeadLettersMessagesThatKeepCrashing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	store.AttemptCeiling = 3
	id := enqueue(t, db.Pool, 1, plain)[0].ID
	for attempt := 1; attempt <= 3; attempt++ {
		if msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute}); len(msgs) != 1 {
			t.Fatalf("attempt %d: nothing to claim", attempt)
		}
		expireLeases(t, db.Pool, id) // the worker died holding it
		if n, err := store.RepairExpiredLeases(ctx, "reaper", 10); err != nil || n != 1 {
			t.Fatalf("repair: %d %v", n, err)
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead WHERE id = $1 AND last_error_code = 'LEASE_EXPIRED'`, id); n != 1 {
		t.Fatal("a message that crashed every attempt is not dead")
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE message_id = $1 AND state = 'ZOMBIE_REQUEUE'`, id); n != 2 {
		t.Fatalf("%d ZOMBIE_REQUEUE attempts, want 2", n)
	}
}

func TestAttemptsArchiveIsAppendOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 2, plain)
	msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
	if _, err := store.CompleteBatch(ctx, "w", dispatched(msgs)); err != nil {
		t.Fatal(err)
	}

	for _, stmt := range []string{
		`UPDATE outbox.attempts SET error_message = 'rewritten'`,
		`DELETE FROM outbox.attempts`,
		`TRUNCATE outbox.attempts`,
	} {
		_, err := db.Pool.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "P0001" {
			t.Errorf("%s: %v, want SQLSTATE P0001", stmt, err)
		}
	}

	// A second DISPATCHED row for a delivered message is refused by the index.
	_, err := db.Pool.Exec(ctx, `INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic) VALUES ($1, 2, 'DISPATCHED', 'billing', 'usage')`, msgs[0].ID)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || !strings.HasSuffix(pgErr.ConstraintName, "_one_dispatched_per_message") {
		t.Fatalf("second DISPATCHED: %v, want 23505 on (a partition's) attempts_one_dispatched_per_message", err)
	}

	// Through the store, the backstop holds for the message it concerns
	// and for that message only: the rest of the batch is recorded.
	enqueue(t, db.Pool, 2, plain)
	second, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 2, Lease: time.Minute})
	if len(second) != 2 {
		t.Fatalf("claimed %d, want 2", len(second))
	}
	poisoned, healthy := second[0], second[1]
	if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic) VALUES ($1, 1, 'DISPATCHED', 'billing', 'usage')`, poisoned.ID); err != nil {
		t.Fatal(err)
	}
	completions, err := store.CompleteBatch(ctx, "w", dispatched(second))
	if err != nil {
		t.Fatalf("a double dispatch of one message failed the whole batch: %v", err)
	}
	want := map[uuid.UUID]outboxtype.Status{poisoned.ID: outboxtype.StatusDoubleDispatch, healthy.ID: outboxtype.StatusOK}
	for _, c := range completions {
		if c.Status != want[c.ID] {
			t.Errorf("message %s: status %s, want %s", c.ID, c.Status, want[c.ID])
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE message_id = $1 AND state = 'DISPATCHED'`, poisoned.ID); n != 1 {
		t.Errorf("the twice-dispatched message has %d DISPATCHED outcomes, want the first one only", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE message_id = $1 AND state = 'DISPATCHED'`, healthy.ID); n != 1 {
		t.Errorf("the healthy message of the batch has %d DISPATCHED outcomes, want 1", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE id = ANY ($1)`, []uuid.UUID{poisoned.ID, healthy.ID}); n != 0 {
		t.Errorf("%d delivered messages still pending", n)
	}
}

// The database answers only for the results not recorded as ok; the
// store still returns one Completion per result, in the results' order,
// each exception on its own result, wherever it is in the batch.
func TestCompleteBatchAnswersEveryResultInOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	store.AttemptCeiling = 1
	enqueue(t, db.Pool, 6, plain)
	msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 6, Lease: time.Minute})
	if err != nil || len(msgs) != 6 {
		t.Fatalf("claimed %d: %v", len(msgs), err)
	}
	results := dispatched(msgs)
	results[1].LeaseToken = uuid.New()
	results[3].Outcome, results[3].ErrorCode = outboxtype.OutcomeRetryable, "TARGET_5XX"
	if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic) VALUES ($1, 1, 'DISPATCHED', 'billing', 'usage')`, msgs[4].ID); err != nil {
		t.Fatal(err)
	}
	want := []outboxtype.Status{outboxtype.StatusOK, outboxtype.StatusLeaseLost, outboxtype.StatusOK, outboxtype.StatusDead, outboxtype.StatusDoubleDispatch, outboxtype.StatusOK}
	completions, err := store.CompleteBatch(ctx, "w", results)
	if err != nil || len(completions) != len(results) {
		t.Fatalf("%d completions for %d results: %v", len(completions), len(results), err)
	}
	for i, c := range completions {
		if c.ID != results[i].ID || c.Status != want[i] {
			t.Errorf("completion %d: %s %s, want %s %s", i, c.ID, c.Status, results[i].ID, want[i])
		}
	}
}

func TestOrderingKeysDeliverInSequence(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 6 })
	ctx := context.Background()
	const keys, perKey = 200, 50
	// Interleave keys, so that every claim sees many keys at once.
	enqueue(t, db.Pool, keys*perKey, func(i int) outbox.Message {
		m := plain(i)
		m.OrderingKey = fmt.Sprintf("key-%03d", i%keys)
		m.Payload = json.RawMessage(fmt.Sprintf(`{"seq":%d}`, i/keys+1))
		return m
	})

	var (
		mu        sync.Mutex
		delivered = map[string][]int64{}
		inFlight  = map[string]bool{}
		wg        sync.WaitGroup
		errs      = make(chan error, 4)
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			store := lease.NewStore(db.Pool)
			worker := fmt.Sprintf("w%d", w)
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			// Another worker may hold every key for a while on a busy
			// machine: give up only after a long time without work.
			lastWork := time.Now()
			for time.Since(lastWork) < 20*time.Second {
				msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: worker, BatchSize: 50, Lease: time.Minute})
				if err != nil {
					errs <- err
					return
				}
				if len(msgs) == 0 {
					if count(t, db.Pool, `SELECT count(*) FROM outbox.pending`) == 0 {
						return
					}
					time.Sleep(5 * time.Millisecond)
					continue
				}
				lastWork = time.Now()
				results := make([]lease.Result, len(msgs))
				mu.Lock()
				for i, m := range msgs {
					if inFlight[m.OrderingKey] {
						errs <- fmt.Errorf("two messages of %s in flight at once", m.OrderingKey)
					}
					inFlight[m.OrderingKey] = true
					results[i] = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeDispatched}
					if rng.IntN(5) == 0 { // 20% fail retryably and are due again at once
						results[i] = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeRetryable, ErrorCode: "TARGET_5XX"}
					} else {
						delivered[m.OrderingKey] = append(delivered[m.OrderingKey], m.SequenceID)
					}
				}
				mu.Unlock()
				// Mark the keys free before completing: once the completion
				// commits, another worker may take the next of the key.
				mu.Lock()
				for _, m := range msgs {
					inFlight[m.OrderingKey] = false
				}
				mu.Unlock()
				if _, err := store.CompleteBatch(ctx, worker, results); err != nil {
					errs <- err
					return
				}
			}
			errs <- fmt.Errorf("%s: gave up with messages still pending", worker)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(delivered) != keys {
		t.Fatalf("%d keys delivered, want %d", len(delivered), keys)
	}
	for key, seqs := range delivered {
		if len(seqs) != perKey {
			t.Fatalf("%s: %d deliveries, want %d", key, len(seqs), perKey)
		}
		for i, s := range seqs {
			if s != int64(i+1) {
				t.Fatalf("%s delivered out of order: %v", key, seqs)
			}
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'RETRYABLE'`); n == 0 {
		t.Fatal("no retryable failures were injected")
	}
}

func TestOrderingHeadBlocksUntilDoneOrDead(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 3, func(i int) outbox.Message {
		m := plain(i)
		m.OrderingKey = "account-7"
		return m
	})
	claim := func() []outboxtype.Message {
		t.Helper()
		msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	}
	head := claim()
	if len(head) != 1 || head[0].SequenceID != 1 {
		t.Fatalf("first claim %v, want only sequence 1", head)
	}
	if more := claim(); len(more) != 0 {
		t.Fatalf("claimed sequence %d while the head is leased", more[0].SequenceID)
	}
	// A retrying head still blocks its key.
	store.CompleteBatch(ctx, "w", []lease.Result{{ID: head[0].ID, LeaseToken: head[0].LeaseToken, Outcome: outboxtype.OutcomeRetryable, RetryAt: time.Now().Add(time.Hour)}})
	if more := claim(); len(more) != 0 {
		t.Fatalf("claimed sequence %d while the head waits to retry", more[0].SequenceID)
	}
	makeDue(t, db.Pool, head[0].ID)
	head = claim()
	if len(head) != 1 || head[0].SequenceID != 1 {
		t.Fatalf("retry claim %v, want sequence 1 again", head)
	}
	// A dead head lets the next message of its key go.
	store.CompleteBatch(ctx, "w", []lease.Result{{ID: head[0].ID, LeaseToken: head[0].LeaseToken, Outcome: outboxtype.OutcomeFailed, ErrorCode: "TARGET_REJECTED"}})
	next := claim()
	if len(next) != 1 || next[0].SequenceID != 2 {
		t.Fatalf("after a dead head: %v, want sequence 2", next)
	}
}

func TestReplayDead(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	// Six dead letters over two namespaces, two codes and two days.
	sent := enqueue(t, db.Pool, 6, func(i int) outbox.Message {
		m := plain(i)
		m.Namespace = []string{"billing", "payments"}[i%2]
		m.OrderingKey = fmt.Sprintf("key-%d", i)
		return m
	})
	msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
	var results []lease.Result
	for _, m := range msgs {
		code := "TARGET_REJECTED"
		if m.Namespace == "payments" && m.SequenceID == 1 && m.OrderingKey == "key-1" {
			code = "ACCESS_DENIED"
		}
		results = append(results, lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeFailed, ErrorCode: code, ErrorMessage: "410 Gone"})
	}
	if _, err := store.CompleteBatch(ctx, "w", results); err != nil {
		t.Fatal(err)
	}
	yesterday := time.Now().Add(-24 * time.Hour)
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.dead SET failed_at = $1 WHERE id = ANY($2)`, yesterday, []uuid.UUID{sent[0].ID, sent[1].ID}); err != nil {
		t.Fatal(err)
	}
	ids := func(idx ...int) []uuid.UUID {
		var out []uuid.UUID
		for _, i := range idx {
			out = append(out, sent[i].ID)
		}
		return out
	}
	cases := []struct {
		name string
		req  lease.ReplayRequest
		want []uuid.UUID
	}{
		{"by namespace", lease.ReplayRequest{Namespace: "payments"}, ids(1, 3, 5)},
		{"by code", lease.ReplayRequest{ErrorCode: "ACCESS_DENIED"}, ids(1)},
		{"by ids", lease.ReplayRequest{MessageIDs: ids(4, 2)}, ids(2, 4)},
		{"failed before", lease.ReplayRequest{FailedBefore: time.Now().Add(-time.Hour)}, ids(0, 1)},
		{"failed after", lease.ReplayRequest{FailedAfter: time.Now().Add(-time.Hour), Namespace: "billing"}, ids(2, 4)},
		{"topic matching nothing", lease.ReplayRequest{Topic: "nope"}, nil},
		{"limit keeps the oldest", lease.ReplayRequest{Limit: 1}, ids(0)},
	}
	for _, tc := range cases {
		tc.req.DryRun = true
		if tc.req.Limit == 0 {
			tc.req.Limit = 100
		}
		got, err := store.ReplayDead(ctx, tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("%s: matched %v, want %v", tc.name, got, tc.want)
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead`); n != 6 {
		t.Fatalf("dry runs moved rows: %d dead left", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'REPLAYED'`); n != 0 {
		t.Fatalf("dry runs wrote attempts")
	}

	moved, err := store.ReplayDead(ctx, lease.ReplayRequest{Namespace: "payments", Limit: 100, Operator: "alice", Reason: "endpoint fixed (INC-42)"})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(moved) != fmt.Sprint(ids(1, 3, 5)) {
		t.Fatalf("moved %v, want %v", moved, ids(1, 3, 5))
	}
	for _, i := range []int{1, 3, 5} {
		var seq int64
		var attempts int
		var due bool
		err := db.Pool.QueryRow(ctx, `SELECT sequence_id, attempt_count, next_attempt_at <= now() AND lease_token IS NULL FROM outbox.pending WHERE id = $1`, sent[i].ID).Scan(&seq, &attempts, &due)
		if err != nil {
			t.Fatalf("replayed message %d not pending: %v", i, err)
		}
		if seq != sent[i].SequenceID || attempts != 0 || !due {
			t.Fatalf("replayed message %d: sequence %d (want %d), attempts %d, due %v", i, seq, sent[i].SequenceID, attempts, due)
		}
		if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE message_id = $1 AND state = 'REPLAYED' AND operator = 'alice' AND reason = 'endpoint fixed (INC-42)'`, sent[i].ID); n != 1 {
			t.Fatalf("replayed message %d has %d REPLAYED attempts with operator and reason", i, n)
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead`); n != 3 {
		t.Fatalf("%d dead letters left, want the 3 unmatched", n)
	}
	again, _ := store.ReplayDead(ctx, lease.ReplayRequest{Namespace: "payments", Limit: 100})
	if len(again) != 0 {
		t.Fatalf("replaying again moved %v", again)
	}
	if _, err := store.ReplayDead(ctx, lease.ReplayRequest{Limit: 0}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("limit 0: %v, want ErrInvalidArgument", err)
	}
}

func TestStatsAndPurge(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 5, func(i int) outbox.Message {
		m := plain(i)
		m.DedupeKey = fmt.Sprintf("k-%d", i)
		return m
	})
	later := plain(99)
	later.AvailableAt = time.Now().Add(time.Hour)
	enqueue(t, db.Pool, 1, func(int) outbox.Message { return later })

	msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 3, Lease: time.Minute})
	// one delivered, one dead, one left leased and then expired
	store.CompleteBatch(ctx, "w", []lease.Result{
		{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: outboxtype.OutcomeDispatched},
		{ID: msgs[1].ID, LeaseToken: msgs[1].LeaseToken, Outcome: outboxtype.OutcomeFailed, ErrorCode: "TARGET_REJECTED"},
	})
	expireLeases(t, db.Pool, msgs[2].ID)

	stats, err := store.Stats(ctx)
	if err != nil || len(stats) != 1 {
		t.Fatalf("stats %v %v", stats, err)
	}
	s := stats[0]
	if s.Namespace != "billing" || s.Topic != "usage" || s.Pending != 4 || s.Due != 2 || s.Leased != 1 || s.ExpiredLeases != 1 || s.Dead != 1 {
		t.Fatalf("stats %+v", s)
	}
	if s.OldestPendingAgeSeconds <= 0 || s.OldestPendingAgeSeconds > 60 {
		t.Fatalf("oldest age %f", s.OldestPendingAgeSeconds)
	}

	age(t, db.Pool, 2*time.Hour)
	res, err := store.Purge(ctx, lease.PurgeParams{AttemptsOlderThan: time.Hour, DedupeOlderThan: time.Hour, MaxRows: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// Only the delivered message's history and key go: the dead letter and
	// the pending messages keep theirs.
	if res.Attempts != 1 || res.Dedupe != 1 {
		t.Fatalf("purged %+v, want 1 attempt and 1 dedupe key", res)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE message_id = $1`, msgs[1].ID); n != 1 {
		t.Fatal("purge removed a dead letter's history")
	}
	if _, err := store.Purge(ctx, lease.PurgeParams{AttemptsOlderThan: -time.Second, MaxRows: 10}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("negative retention: %v", err)
	}
	// The database holds any caller to the floor the reaper's settings have.
	if _, err := store.Purge(ctx, lease.PurgeParams{AttemptsOlderThan: time.Minute, MaxRows: 10}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("a retention under an hour: %v, want refused", err)
	}
}

func TestInvalidCallsAreRefusedWhole(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 2, plain)

	if _, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 0, Lease: time.Minute}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("batch size 0: %v", err)
	}
	if _, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "", BatchSize: 1, Lease: time.Minute}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("empty worker: %v", err)
	}
	msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 2, Lease: time.Minute})
	// One good result and one with an unknown outcome: nothing is written.
	_, err := store.CompleteBatch(ctx, "w", []lease.Result{
		{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: outboxtype.OutcomeDispatched},
		{ID: msgs[1].ID, LeaseToken: msgs[1].LeaseToken, Outcome: "DELIVERED"},
	})
	if !errors.Is(err, lease.ErrInvalidCompletion) {
		t.Fatalf("unknown outcome: %v, want ErrInvalidCompletion", err)
	}
	_, err = store.CompleteBatch(ctx, "w", []lease.Result{
		{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: outboxtype.OutcomeDispatched},
		{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: outboxtype.OutcomeFailed},
	})
	if !errors.Is(err, lease.ErrInvalidCompletion) {
		t.Fatalf("duplicate id: %v, want ErrInvalidCompletion", err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts`); n != 0 {
		t.Fatalf("refused completions wrote %d attempts", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NOT NULL`); n != 2 {
		t.Fatal("refused completions changed leases")
	}
}

func TestClaimReturnsPayloadAndHeadersIntact(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	enqueue(t, db.Pool, 2, func(i int) outbox.Message {
		m := plain(i)
		m.Payload = json.RawMessage(fmt.Sprintf(`{"n": %d, "nested": {"a": [1, 2.5, "x\u00e9"]}}`, i))
		if i == 0 {
			m.Headers = map[string]string{"x-request-id": "r-1", "priority": "high"}
		}
		return m
	})
	msgs, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 2, Lease: time.Minute})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("claim: %v (%d)", err, len(msgs))
	}
	for _, m := range msgs {
		var got map[string]any
		if err := json.Unmarshal(m.Payload, &got); err != nil {
			t.Fatalf("claimed payload %q is not JSON: %v", m.Payload, err)
		}
		nested, _ := got["nested"].(map[string]any)
		if a, _ := nested["a"].([]any); len(a) != 3 || a[2] != "xé" {
			t.Fatalf("claimed payload %s lost content", m.Payload)
		}
		switch got["n"] {
		case float64(0):
			if m.Headers["x-request-id"] != "r-1" || m.Headers["priority"] != "high" || len(m.Headers) != 2 {
				t.Errorf("headers %v", m.Headers)
			}
		default:
			if len(m.Headers) != 0 {
				t.Errorf("a message without headers claimed with %v", m.Headers)
			}
		}
	}
}

// The claim reads each row's payload, namespace and topic in place and
// copies them out: every message must come back with its own bytes,
// whatever the rows after it held, and a caller that appends to one payload
// must not write over the next.
func TestClaimedMessagesOwnTheirPayloads(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	const n = 300 // about 180 KB of payloads: many reads of the connection's buffer
	padOf := func(i int) string {
		size := 400 + i%7*100
		if i%50 == 7 {
			size = 40_000 // larger than the connection's read buffer
		}
		return strings.Repeat(string(rune('a'+i%26)), size)
	}
	enqueue(t, db.Pool, n, func(i int) outbox.Message {
		m := plain(i)
		m.Namespace, m.Topic = fmt.Sprintf("ns-%d", i%3), fmt.Sprintf("topic-%d", i%5)
		m.Payload = json.RawMessage(fmt.Sprintf(`{"n":%d,"pad":%q}`, i, padOf(i)))
		return m
	})
	msgs, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: n, Lease: time.Minute})
	if err != nil || len(msgs) != n {
		t.Fatalf("claim: %v (%d)", err, len(msgs))
	}
	claimed := make([]string, n)
	for k, m := range msgs {
		var p struct {
			N   int
			Pad string
		}
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			t.Fatalf("claimed payload %.60q is not JSON: %v", m.Payload, err)
		}
		if p.Pad != padOf(p.N) || m.Namespace != fmt.Sprintf("ns-%d", p.N%3) || m.Topic != fmt.Sprintf("topic-%d", p.N%5) {
			t.Fatalf("message %d came back as %s/%s with a payload of %d bytes, not as enqueued", p.N, m.Namespace, m.Topic, len(m.Payload))
		}
		claimed[k] = string(m.Payload)
	}
	const suffix = `, "appended": true}`
	for k := range msgs {
		msgs[k].Payload = append(msgs[k].Payload, suffix...)
	}
	for k, m := range msgs {
		if string(m.Payload) != claimed[k]+suffix {
			t.Fatalf("message %d's payload changed when the others were appended to: %.80q", k, m.Payload)
		}
	}
}

// A completion's cost on the dispatcher must not grow by a heap object per
// result: pgx hands each element of an array argument to its encoder as an
// interface value, and one whose Go type it encodes only through
// reflection (a *string, an *int32) is copied to the heap there, which for
// a batch of 1,000 is thousands of objects for the collector on every
// completion. Not parallel: the allocations are counted for the whole
// process, with no other test running.
func TestCompleteBatchEncodesItsResultsWithoutAnObjectEach(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	mallocs := func(n int) uint64 {
		t.Helper()
		enqueue(t, db.Pool, n, plain)
		msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: n, Lease: time.Minute})
		if err != nil || len(msgs) != n {
			t.Fatalf("claimed %d of %d: %v", len(msgs), n, err)
		}
		results := make([]lease.Result, n)
		for i, m := range msgs {
			results[i] = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeDispatched,
				Target: "eventbridge:orders", TargetRef: fmt.Sprintf("event-%d", i), Latency: time.Duration(i) * time.Millisecond}
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		done, err := store.CompleteBatch(ctx, "w", results)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range done {
			if c.Status != outboxtype.StatusOK {
				t.Fatalf("message %s completed as %s", c.ID, c.Status)
			}
		}
		return after.Mallocs - before.Mallocs
	}
	const small, large = 10, 1010
	for range 3 { // the fewest of three, against a stray allocation elsewhere in the process
		grew := int64(mallocs(large)) - int64(mallocs(small))
		if perResult := float64(grew) / (large - small); perResult < 0.5 {
			return
		} else {
			t.Logf("a completion of %d results allocated %d objects more than one of %d: %.2f per result", large, grew, small, perResult)
		}
	}
	t.Error("every completion allocated at least half a heap object per result")
}
