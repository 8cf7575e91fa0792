package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// zombieRequeues returns, per message, the ZOMBIE_REQUEUE outcomes archived
// for it as "worker: error message".
func zombieRequeues(t *testing.T, pool *pgxpool.Pool) map[uuid.UUID][]string {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT message_id, worker_id || ': ' || error_message FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[uuid.UUID][]string{}
	for rows.Next() {
		var id uuid.UUID
		var s string
		if err := rows.Scan(&id, &s); err != nil {
			t.Fatal(err)
		}
		out[id] = append(out[id], s)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	return out
}

// A crashed claimer's messages, their lease expired, come back in the next
// claim, in that one call: each with a fresh lease and its next attempt,
// and a ZOMBIE_REQUEUE by the new claimer that names the old holder. The
// reaper then finds nothing left to do.
func TestClaimTakesOverExpiredLeases(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 3, plain)

	crashed, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "lambda-crashed", BatchSize: 10, Lease: time.Minute})
	if err != nil || len(crashed) != 3 {
		t.Fatalf("claim: %d %v", len(crashed), err)
	}
	expireLeases(t, db.Pool, ids(crashed)...)

	taken, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "lambda-next", BatchSize: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(taken), ids(crashed); len(got) != 3 || !sameIDs(got, want) {
		t.Fatalf("the next claim took %v, want the crashed claim's %v", got, want)
	}
	for _, m := range taken {
		if m.Attempt != 2 || m.LeaseToken == crashed[0].LeaseToken || !m.LeaseExpiresAt.After(time.Now()) {
			t.Fatalf("taken over %s: attempt %d, token %s, expiry %s; want attempt 2 under a fresh lease",
				m.ID, m.Attempt, m.LeaseToken, m.LeaseExpiresAt)
		}
	}
	zombies := zombieRequeues(t, db.Pool)
	for _, m := range crashed {
		want := "lambda-next: lease held by lambda-crashed expired before completion"
		if got := zombies[m.ID]; !slices.Equal(got, []string{want}) {
			t.Errorf("ZOMBIE_REQUEUE of %s: %q, want [%q]", m.ID, got, want)
		}
	}
	if n, err := store.RepairExpiredLeases(ctx, "reaper", 100); err != nil || n != 0 {
		t.Fatalf("the reaper repaired %d (%v) after the claim took everything over", n, err)
	}
	if c, err := store.CompleteBatch(ctx, "lambda-crashed", dispatched(crashed)); err != nil || c[0].Status != outboxtype.StatusLeaseLost {
		t.Fatalf("the crashed holder's late completion: %+v %v, want lease_lost", c, err)
	}
	if c, err := store.CompleteBatch(ctx, "lambda-next", dispatched(taken)); err != nil || c[0].Status != outboxtype.StatusOK {
		t.Fatalf("the new holder's completion: %+v %v", c, err)
	}
}

func sameIDs(a, b []uuid.UUID) bool {
	key := func(x, y uuid.UUID) int { return strings.Compare(x.String(), y.String()) }
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, key)
	slices.SortFunc(b, key)
	return slices.Equal(a, b)
}

// A live lease is never taken over, however many claims come by.
func TestClaimLeavesLiveLeasesAlone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 2, plain)
	enqueue(t, db.Pool, 3, ordered("payments", "acct-1"))

	held, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "alive", BatchSize: 10, MaxRun: 10, Lease: 2 * time.Second})
	if err != nil || len(held) != 5 {
		t.Fatalf("claim: %d %v", len(held), err)
	}
	for range 3 {
		if got, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "other", BatchSize: 10, MaxRun: 10, Lease: time.Minute}); err != nil || len(got) != 0 {
			t.Fatalf("another claim took %d live leases (%v)", len(got), err)
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE'`); n != 0 {
		t.Fatalf("%d ZOMBIE_REQUEUE outcomes for live leases", n)
	}
	if c, err := store.CompleteBatch(ctx, "alive", dispatched(held)); err != nil || slices.ContainsFunc(c, func(c lease.Completion) bool { return c.Status != outboxtype.StatusOK }) {
		t.Fatalf("the holder's completion: %+v %v", c, err)
	}
}

// Leases are judged by the clock: a claim inside a transaction that began
// before a lease expired takes it over all the same.
func TestClaimTakesOverByTheClock(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	enqueue(t, db.Pool, 1, plain)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	store := lease.NewStore(tx)
	first, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w1", BatchSize: 1, Lease: time.Second})
	if err != nil || len(first) != 1 {
		t.Fatalf("claim: %d %v", len(first), err)
	}
	time.Sleep(1500 * time.Millisecond) // the lease runs out; now() does not move
	again, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w2", BatchSize: 1, Lease: time.Minute})
	if err != nil || len(again) != 1 || again[0].ID != first[0].ID || again[0].Attempt != 2 {
		t.Fatalf("claim after the lease ran out: %+v %v, want the message again, attempt 2", again, err)
	}
}

// An ordered key's run is taken over whole, by one claim, even one whose
// batch is smaller than the run: every message of it requeued (a
// ZOMBIE_REQUEUE each), the head still the head, and the run claimed again
// in sequence order as far as the batch goes; the rest wait behind it.
func TestClaimTakesOverAnOrderedRunWhole(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 5, ordered("payments", "acct-9"))

	crashed := claimRun(t, store, "crashed", 10, 5)
	if len(crashed) != 5 {
		t.Fatalf("claimed %d, want the run of 5", len(crashed))
	}
	expireLeases(t, db.Pool, ids(crashed)...)

	taken := claimRun(t, store, "taker", 3, 5)
	if got := sequences(taken); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("the taker claimed %v, want 1-3", got)
	}
	zombies := zombieRequeues(t, db.Pool)
	for _, m := range crashed {
		if len(zombies[m.ID]) != 1 || !strings.HasPrefix(zombies[m.ID][0], "taker: lease held by crashed") {
			t.Errorf("ZOMBIE_REQUEUE of sequence %d: %q, want one by the taker naming crashed", m.SequenceID, zombies[m.ID])
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token = $1`, crashed[0].LeaseToken); n != 0 {
		t.Fatalf("%d messages still hold the crashed claim's lease", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NULL AND behind AND sequence_id IN (4, 5)`); n != 2 {
		t.Fatalf("%d of sequences 4 and 5 free behind the head, want 2", n)
	}
	if got := claimRun(t, store, "other", 10, 5); len(got) != 0 {
		t.Fatalf("another claim got %v while the taker holds the key", sequences(got))
	}
	if _, err := store.CompleteBatch(ctx, "taker", dispatched(taken)); err != nil {
		t.Fatal(err)
	}
	if got := sequences(claimRun(t, store, "other", 10, 5)); !slices.Equal(got, []int64{4, 5}) {
		t.Fatalf("after the taker's run: %v, want 4 and 5", got)
	}
}

// A message whose every claimer crashes is dead-lettered by the claim that
// finds it at the store's attempt ceiling (LEASE_EXPIRED), and under
// on_dead = park it holds its key.
func TestClaimTakeoverDeadLettersAtTheCeiling(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	store.AttemptCeiling = 3
	enqueue(t, db.Pool, 2, ordered("payments", "acct-3"))
	unordered := enqueue(t, db.Pool, 1, plain)[0].ID

	// Attempt 1 fails retryably with the route's policy: park.
	first := claimRun(t, store, "w", 10, 1)
	if len(first) != 2 {
		t.Fatalf("claimed %d, want the key's head and the unordered message", len(first))
	}
	var head outboxtype.Message
	for _, m := range first {
		if m.OrderingKey != "" {
			head = m
		}
	}
	results := dispatched(first)
	for i := range results {
		results[i].Outcome, results[i].ErrorCode, results[i].OnDead = outboxtype.OutcomeRetryable, "TARGET_5XX", outboxtype.OnDeadPark
	}
	if _, err := store.CompleteBatch(ctx, "w", results); err != nil {
		t.Fatal(err)
	}
	// Attempts 2 and 3 crash.
	for attempt := 2; attempt <= 3; attempt++ {
		got := claimRun(t, store, fmt.Sprintf("crash-%d", attempt), 10, 1)
		if len(got) != 2 || got[0].Attempt != attempt {
			t.Fatalf("attempt %d: claimed %+v", attempt, got)
		}
		expireLeases(t, db.Pool, ids(got)...)
	}
	if got := claimRun(t, store, "taker", 10, 10); len(got) != 0 {
		t.Fatalf("claimed %d messages of a parked key or at the ceiling", len(got))
	}
	rows, err := db.Pool.Query(ctx, `SELECT id, last_error_code, failed_by, holds_key, attempt_count FROM outbox.dead ORDER BY sequence_id NULLS LAST`)
	if err != nil {
		t.Fatal(err)
	}
	type deadRow struct {
		id              uuid.UUID
		code, failedBy  string
		holdsKey        bool
		attemptsAtDeath int
	}
	var dead []deadRow
	for rows.Next() {
		var d deadRow
		if err := rows.Scan(&d.id, &d.code, &d.failedBy, &d.holdsKey, &d.attemptsAtDeath); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, d)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	want := []deadRow{{head.ID, "LEASE_EXPIRED", "taker", true, 3}, {unordered, "LEASE_EXPIRED", "taker", false, 3}}
	if !slices.Equal(dead, want) {
		t.Fatalf("dead letters %+v, want %+v", dead, want)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'FAILED' AND error_code = 'LEASE_EXPIRED' AND worker_id = 'taker'`); n != 2 {
		t.Fatalf("%d FAILED LEASE_EXPIRED outcomes by the taker, want 2", n)
	}
	blocked, err := store.BlockedKeys(ctx, "", 10)
	if err != nil || len(blocked) != 1 || blocked[0].State != lease.BlockedParked || blocked[0].MessageID != head.ID {
		t.Fatalf("blocked keys %+v (%v), want acct-3 parked on its head", blocked, err)
	}
}

// A claim confined to namespaces takes over only their leases; the others
// are left to claims of theirs, or to the reaper.
func TestClaimTakesOverOnlyItsNamespaces(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 2, func(i int) outbox.Message { m := plain(i); m.Namespace = "billing"; return m })
	enqueue(t, db.Pool, 2, func(i int) outbox.Message { m := plain(i); m.Namespace = "payments"; return m })
	crashed, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "crashed", BatchSize: 10, Lease: time.Minute})
	if err != nil || len(crashed) != 4 {
		t.Fatalf("claim: %d %v", len(crashed), err)
	}
	expireLeases(t, db.Pool, ids(crashed)...)

	got, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "billing-only", BatchSize: 10, Lease: time.Minute, Namespaces: []string{"billing"}})
	if err != nil || len(got) != 2 || got[0].Namespace != "billing" || got[1].Namespace != "billing" {
		t.Fatalf("a billing claim took %+v (%v), want billing's 2", got, err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE namespace = 'payments' AND claimed_by = 'crashed'`); n != 2 {
		t.Fatalf("%d of payments' expired leases left, want 2", n)
	}
	if n, err := store.RepairExpiredLeases(ctx, "reaper", 10); err != nil || n != 2 {
		t.Fatalf("the reaper repaired %d (%v), want payments' 2", n, err)
	}
}

// Claimers racing to take over the same expired leases — unordered
// messages and ordered runs, with batches that cut through the runs — never
// both lease a message, never split a run between them, and together take
// everything back.
func TestConcurrentClaimsTakeOverEachLeaseOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 8 })
	ctx := context.Background()
	const keys, perKey, loose, claimers = 20, 10, 200, 4
	enqueue(t, db.Pool, loose, plain)
	enqueue(t, db.Pool, keys*perKey, func(i int) outbox.Message {
		m := plain(i)
		m.Namespace, m.OrderingKey = "payments", fmt.Sprintf("acct-%d", i%keys)
		return m
	})
	const total = loose + keys*perKey

	for round := range 3 {
		// One claim takes everything, so that every run is whole.
		all, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: fmt.Sprintf("crashed-%d", round), BatchSize: total, MaxRun: perKey, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != total {
			t.Fatalf("round %d: the crashing claimer took %d, want %d", round, len(all), total)
		}
		expireLeases(t, db.Pool, ids(all)...)

		var (
			mu    sync.Mutex
			taken = map[uuid.UUID]string{} // message → worker
			start = make(chan struct{})
			wg    sync.WaitGroup
			errs  = make(chan error, claimers)
		)
		for w := range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				worker := fmt.Sprintf("taker-%d-%d", round, w)
				store := lease.NewStore(db.Pool)
				<-start
				for {
					got, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: worker, BatchSize: 7 + w, MaxRun: perKey, Lease: time.Minute})
					if err != nil {
						errs <- err
						return
					}
					if len(got) == 0 {
						return
					}
					mu.Lock()
					for _, m := range got {
						if other, dup := taken[m.ID]; dup {
							errs <- fmt.Errorf("message %s leased by both %s and %s", m.ID, other, worker)
						}
						taken[m.ID] = worker
					}
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// Every message taken over once, and claimed again once unless it
		// waits behind its key's head, which a taker holds (and not in the
		// run leased with it); every leased key under one lease.
		if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE claimed_by LIKE 'crashed-%'`); n != 0 {
			t.Fatalf("round %d: %d messages still under the crashed claims' leases", round, n)
		}
		waiting := count(t, db.Pool, `SELECT count(*) FROM outbox.pending p WHERE p.lease_token IS NULL AND p.behind
			AND EXISTS (SELECT 1 FROM outbox.pending h WHERE h.namespace = p.namespace AND h.ordering_key = p.ordering_key
			            AND NOT h.behind AND h.claimed_by LIKE 'taker-%'
			            AND NOT coalesce(h.run_through >= p.sequence_id, false))`)
		if len(taken)+waiting != total || len(taken) < loose {
			t.Fatalf("round %d: the takers claimed %d messages and %d wait behind their heads, want %d in all", round, len(taken), waiting, total)
		}
		if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE' AND error_message LIKE $1`,
			fmt.Sprintf("lease held by crashed-%d %%", round)); n != total {
			t.Fatalf("round %d: %d ZOMBIE_REQUEUE outcomes, want one per message (%d)", round, n, total)
		}
		if n := count(t, db.Pool, `SELECT count(*) FROM (SELECT 1 FROM outbox.pending WHERE ordering_key IS NOT NULL
			GROUP BY namespace, ordering_key HAVING count(DISTINCT lease_token) > 1) x`); n != 0 {
			t.Fatalf("round %d: %d keys leased to two claims at once", round, n)
		}
		// Given back for the next round.
		if _, err := db.Pool.Exec(ctx, `SELECT outbox.complete_batch(claimed_by, jsonb_agg(jsonb_build_object(
				'id', id, 'lease_token', lease_token, 'outcome', 'RELEASED')))
			FROM outbox.pending WHERE claimed_by IS NOT NULL GROUP BY claimed_by`); err != nil {
			t.Fatal(err)
		}
	}
}

// The backlog estimate counts what claims could take now — due heads (a
// key once, whatever its run), due unordered messages and expired leases —
// up to its limit, and nothing leased, not yet due, or behind a head.
func TestClaimableEstimate(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	estimate := func(limit int, namespaces ...string) int {
		t.Helper()
		n, err := store.ClaimableEstimate(ctx, limit, namespaces)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := estimate(100); n != 0 {
		t.Fatalf("an empty queue: %d", n)
	}
	enqueue(t, db.Pool, 6, plain)                         // billing: 6 due
	enqueue(t, db.Pool, 4, ordered("payments", "acct-1")) // payments: 1 head
	enqueue(t, db.Pool, 3, func(i int) outbox.Message {   // billing: not due for an hour
		m := plain(i)
		m.AvailableAt = time.Now().Add(time.Hour)
		return m
	})
	if n := estimate(100); n != 7 {
		t.Fatalf("estimate %d, want 6 unordered and 1 head", n)
	}
	if n := estimate(100, "payments"); n != 1 {
		t.Fatalf("payments' estimate %d, want its 1 head", n)
	}
	if n := estimate(4); n != 4 {
		t.Fatalf("estimate with limit 4: %d", n)
	}

	// 3 claimed (live), 2 claimed by a claimer that crashed (expired).
	live, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "alive", BatchSize: 3, Lease: time.Minute, Namespaces: []string{"billing"}})
	if err != nil || len(live) != 3 {
		t.Fatalf("claim: %d %v", len(live), err)
	}
	crashed, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "crashed", BatchSize: 2, Lease: time.Minute, Namespaces: []string{"billing"}})
	if err != nil || len(crashed) != 2 {
		t.Fatalf("claim: %d %v", len(crashed), err)
	}
	if n := estimate(100); n != 2 {
		t.Fatalf("estimate %d, want the 1 unordered message and the head left", n)
	}
	expireLeases(t, db.Pool, ids(crashed)...)
	if n := estimate(100); n != 4 {
		t.Fatalf("estimate %d, want 2 due and 2 expired", n)
	}
	if n := estimate(3, "billing"); n != 3 {
		t.Fatalf("billing's estimate with limit 3: %d", n)
	}

	for _, limit := range []int{0, -1, 1_000_001} {
		if _, err := store.ClaimableEstimate(ctx, limit, nil); !errors.Is(err, lease.ErrInvalidArgument) {
			t.Errorf("limit %d: %v, want ErrInvalidArgument", limit, err)
		}
	}
}
