package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

func ordered(namespace, key string) func(i int) outbox.Message {
	return func(i int) outbox.Message {
		m := plain(i)
		m.Namespace, m.OrderingKey = namespace, key
		return m
	}
}

// byKey groups claimed messages by ordering key ("" for unordered), in the
// order the claim returned them.
func byKey(msgs []outboxtype.Message) map[string][]outboxtype.Message {
	out := map[string][]outboxtype.Message{}
	for _, m := range msgs {
		out[m.OrderingKey] = append(out[m.OrderingKey], m)
	}
	return out
}

func sequences(msgs []outboxtype.Message) []int64 {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		out[i] = m.SequenceID
	}
	return out
}

func claimRun(t *testing.T, store *lease.Store, worker string, batch, run int) []outboxtype.Message {
	t.Helper()
	msgs, err := store.ClaimBatch(context.Background(), lease.ClaimParams{WorkerID: worker, BatchSize: batch, MaxRun: run, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// A claim hands out a run per key, in sequence order, the key's head
// first; while it is leased no other claim gets anything of the key; a run
// that fails at its k-th message keeps 1..k-1 delivered, k retrying and the
// rest released untouched, so the next claim starts again at k.
func TestClaimHandsOutOrderedRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	for _, key := range []string{"acct-1", "acct-2", "acct-3"} {
		enqueue(t, db.Pool, 20, ordered("payments", key))
	}
	enqueue(t, db.Pool, 5, plain)

	first := claimRun(t, store, "w1", 100, 10)
	groups := byKey(first)
	if len(first) != 35 || len(groups[""]) != 5 {
		t.Fatalf("claimed %d messages (%d unordered), want 3 runs of 10 and the 5 unordered", len(first), len(groups[""]))
	}
	for _, key := range []string{"acct-1", "acct-2", "acct-3"} {
		if got := sequences(groups[key]); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
			t.Fatalf("%s: run %v, want sequences 1-10 in order", key, got)
		}
	}
	// The runs of one key are contiguous in the claim's answer.
	seen := map[string]bool{}
	for i, m := range first {
		if m.OrderingKey != "" && seen[m.OrderingKey] && first[i-1].OrderingKey != m.OrderingKey {
			t.Fatalf("the run of %s is split in the claim's answer", m.OrderingKey)
		}
		seen[m.OrderingKey] = true
	}
	if more := claimRun(t, store, "w2", 100, 10); len(more) != 0 {
		t.Fatalf("a second claim got %d messages (sequence %d of %s) while the keys are in flight", len(more), more[0].SequenceID, more[0].OrderingKey)
	}

	// acct-1's run fails at its 4th message.
	var results []lease.Result
	for _, m := range first {
		r := lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeDispatched}
		if m.OrderingKey == "acct-1" {
			switch {
			case m.SequenceID == 4:
				r = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeRetryable, ErrorCode: "TARGET_5XX"}
			case m.SequenceID > 4:
				r = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeReleased}
			}
		}
		results = append(results, r)
	}
	if _, err := store.CompleteBatch(ctx, "w1", results); err != nil {
		t.Fatal(err)
	}
	var released []uuid.UUID
	for _, m := range groups["acct-1"][4:] {
		released = append(released, m.ID)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE message_id = ANY ($1)`, released); n != 0 {
		t.Errorf("released messages have %d archived outcomes, want none", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE id = ANY ($1) AND attempt_count = 0 AND lease_token IS NULL`, released); n != len(released) {
		t.Errorf("%d of %d released messages are unleased with no attempt charged", n, len(released))
	}

	next := claimRun(t, store, "w2", 100, 10)
	groups = byKey(next)
	if got := sequences(groups["acct-1"]); !slices.Equal(got, []int64{4, 5, 6, 7, 8, 9, 10, 11, 12, 13}) {
		t.Fatalf("acct-1 after a failure at 4: run %v, want 4-13", got)
	}
	if got := sequences(groups["acct-2"]); !slices.Equal(got, []int64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}) {
		t.Fatalf("acct-2's next run %v, want 11-20", got)
	}
	if groups["acct-1"][0].Attempt != 2 || groups["acct-1"][1].Attempt != 1 {
		t.Errorf("attempts of 4 and 5: %d and %d, want 2 and 1", groups["acct-1"][0].Attempt, groups["acct-1"][1].Attempt)
	}
}

// The claim takes one of two ways, chosen by its first claimable head (see
// outbox.claim_batch's "Cost"): behind unordered messages, ordered heads
// still come with their runs, and the keys' runs start at their heads.
func TestClaimHandsOutRunsBehindUnorderedMessages(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 5, plain)
	for _, key := range []string{"acct-1", "acct-2"} {
		enqueue(t, db.Pool, 20, ordered("payments", key))
	}
	got := claimRun(t, store, "w1", 30, 10)
	groups := byKey(got)
	if len(got) != 25 || len(groups[""]) != 5 {
		t.Fatalf("claimed %d messages (%d unordered), want the 5 unordered and 2 runs of 10", len(got), len(groups[""]))
	}
	for _, key := range []string{"acct-1", "acct-2"} {
		if seq := sequences(groups[key]); !slices.Equal(seq, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
			t.Fatalf("%s: run %v, want sequences 1-10 in order", key, seq)
		}
	}
}

// A run stops before a message that is not due (delayed by its producer):
// nothing behind it overtakes it.
func TestRunStopsAtAMessageNotDue(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 6, func(i int) outbox.Message {
		m := ordered("payments", "acct-9")(i)
		if i == 3 {
			m.AvailableAt = time.Now().Add(time.Hour)
		}
		return m
	})
	got := sequences(claimRun(t, store, "w", 100, 10))
	if !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("run %v, want 1-3 (4 is not due)", got)
	}
}

// The claim's cost does not grow with a stuck key's backlog: with 200,000
// messages queued behind a head scheduled far ahead, a claim of other work
// reads only what it takes. Measured as the tuples of outbox.pending the
// claim reads, by index and by sequential scan, not as time.
func TestStuckKeyCostsTheClaimNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// The backlog, written directly (as 200,000 enqueues would leave it)
	// to keep the test fast: a head due in a year and the key's messages
	// behind it, all of them due.
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox.pending (id, namespace, topic, ordering_key, sequence_id, payload, payload_bytes,
		                            behind, available_at, next_attempt_at)
		SELECT outbox.uuid_v7(), 'payments', 'captured', 'acct-stuck', g, '{"n":1}', 7, g > 1,
		       CASE WHEN g = 1 THEN now() + interval '1 year' ELSE now() END,
		       CASE WHEN g = 1 THEN now() + interval '1 year' ELSE now() END
		FROM generate_series(1, 200000) g;
		INSERT INTO outbox.sequences (namespace, ordering_key, last_sequence_id) VALUES ('payments', 'acct-stuck', 200000);
		INSERT INTO outbox.keys (namespace, ordering_key) VALUES ('payments', 'acct-stuck');
		ANALYZE outbox.pending;`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, 100, plain)

	got, delta := claimOf100ReadingTuples(ctx, t, db.Pool)
	if len(got) != 100 {
		t.Fatalf("claimed %d, want the 100 unordered messages", len(got))
	}
	for _, m := range got {
		if m.OrderingKey != "" {
			t.Fatalf("claimed sequence %d of the stuck key", m.SequenceID)
		}
	}
	// The 100 rows taken, the primary key lookups of the update, and the
	// unsettled-keys probe; nothing of the 200,000.
	if delta > 1000 {
		t.Fatalf("the claim read %d tuples of outbox.pending for 100 messages: it waded through the stuck key's backlog", delta)
	}
	t.Logf("one claim of 100 read %d tuples of outbox.pending beside a stuck key with 200,000 queued", delta)
}

// Concurrent claims leave the head of the claim index full of entries a
// claim cannot take: the old versions of rows another claim just leased,
// which no claim may clean away while some other transaction's snapshot
// could still see them. A claim of unordered messages steps over them
// once, in the scan that takes its rows, not again in a probe of the first
// claimable head for an ordered run (1.3-1.5 more index entries read a
// message at 4 connections: bench/cmd/floor's scan/msg). Counted as the
// entries of pending_claimable the claiming transaction's scans returned.
func TestAClaimStepsOverRowsOtherClaimsTookOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	enqueue(t, db.Pool, 300, plain)
	// A snapshot held open, as another dispatcher's call holds one: the
	// claimed rows' old versions stay in the index, uncleanable.
	reader, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx) //nolint:errcheck
	// The transaction's snapshot is taken by its first query.
	var pending int
	if err := reader.QueryRow(ctx, `SELECT count(*) FROM outbox.pending`).Scan(&pending); err != nil || pending != 300 {
		t.Fatalf("the open snapshot sees %d pending, want 300 (%v)", pending, err)
	}
	store := lease.NewStore(db.Pool)
	params := lease.ClaimParams{WorkerID: "w", BatchSize: 100, MaxRun: 100, Lease: time.Minute}
	first, err := store.ClaimBatch(ctx, params)
	if err != nil || len(first) != 100 {
		t.Fatalf("first claim: %d messages, %v", len(first), err)
	}

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	read := func() int64 {
		t.Helper()
		var n int64
		if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_returned('outbox.pending_claimable'::regclass)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := read()
	second, err := lease.NewStore(tx).ClaimBatch(ctx, params)
	if err != nil || len(second) != 100 {
		t.Fatalf("second claim: %d messages, %v", len(second), err)
	}
	entries := read() - before
	// The first claim's 100 old versions, and the 100 rows taken.
	if entries < 200 {
		t.Fatalf("the claim's scans returned %d entries of pending_claimable: fewer than the 200 it must read (the measurement is broken)", entries)
	}
	if entries > 210 {
		t.Fatalf("the claim's scans returned %d entries of pending_claimable for 100 rows behind 100 another claim took: it stepped over them more than once", entries)
	}
	t.Logf("the claim read %d entries of pending_claimable for 100 rows behind 100 another claim took", entries)
}

// The dispatcher's calls never JIT-compile their statements: each touches
// a bounded number of rows by index, and a compilation (tens of
// milliseconds, not cached between calls) would cost more than the call.
// The planner cannot know that, and a long key behind a stuck head lifts
// its estimates past jit_above_cost (a claim of 100 took 2.7 times as long
// beside 200,000 such messages). Shown with every plan costly enough to
// compile (jit_above_cost = 0), as auto_explain reports the plans of the
// statements inside the functions.
func TestDispatcherCallsNeverJITCompile(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	var jitAvailable bool
	if err := db.Pool.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&jitAvailable); err != nil {
		t.Fatal(err)
	}
	if !jitAvailable {
		t.Skip("this server has no JIT provider: nothing would be compiled either way")
	}
	enqueue(t, db.Pool, 20, ordered("payments", "acct-1"))
	enqueue(t, db.Pool, 20, plain)

	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var plans []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { plans = append(plans, n.Message) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, set := range []string{
		`LOAD 'auto_explain'`,
		`SET jit = on`,
		`SET jit_above_cost = 0`,
		`SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_nested_statements = on`,
		`SET auto_explain.log_level = notice`,
	} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatalf("%s: %v", set, err)
		}
	}
	// Reports the statements inside the call that were compiled (the
	// call's own statement is planned in this session, where it may be).
	compiled := func(call string) {
		t.Helper()
		for _, plan := range plans {
			if strings.Contains(plan, "\nJIT:") && !strings.Contains(plan, call+"(") {
				text, _, _ := strings.Cut(plan[strings.Index(plan, "Query Text:"):], "\n")
				t.Errorf("%s JIT-compiled a statement of its own: %s", call, text)
			}
		}
		plans = nil
	}

	store := lease.NewStore(conn)
	msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 30, MaxRun: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	compiled("outbox.claim_batch")
	if _, err := store.CompleteBatch(ctx, "w", dispatched(msgs[:20])); err != nil {
		t.Fatal(err)
	}
	compiled("outbox.complete_batch")
	var leased []uuid.UUID
	for _, m := range msgs[20:] {
		leased = append(leased, m.ID)
	}
	expireLeases(t, db.Pool, leased...)
	if n, err := store.RepairExpiredLeases(ctx, "reaper", 100); err != nil || n != len(leased) {
		t.Fatalf("repaired %d of %d expired leases: %v", n, len(leased), err)
	}
	compiled("outbox.repair_expired_leases")
}

// lockedByClaim counts the rows of outbox.pending that the transaction
// tx has row-locked without leasing them (a lock's xmax is the locker's
// transaction id; a leased row was updated instead): what a claim read and
// held for nothing.
func lockedByClaim(t *testing.T, tx pgx.Tx) (heads, followers int) {
	t.Helper()
	if err := tx.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE NOT behind), count(*) FILTER (WHERE behind)
		FROM outbox.pending WHERE lease_token IS NULL AND xmax = pg_current_xact_id()::xid`).Scan(&heads, &followers); err != nil {
		t.Fatal(err)
	}
	return heads, followers
}

// A claim of many ordered keys reads and locks about what it takes: the
// runs that fill the batch, not a run behind every head it looked at, and
// only the heads of those runs.
// Measured as rows the claim fetched through outbox.pending's indexes and
// rows it locked, not as time.
func TestClaimOfManyKeysReadsOnlyTheRunsItTakes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// 200 keys of 30 messages, each key's messages spread over the queue
	// as many producers write them: message i on key i mod 200.
	const keys, perKey, batch = 200, 30, 100
	enqueue(t, db.Pool, keys*perKey, func(i int) outbox.Message {
		return ordered("payments", fmt.Sprintf("acct-%d", i%keys))(i)
	})
	// Statistics, as a served database has them, so that the claim's
	// plans are the ones it runs in production.
	if _, err := db.Pool.Exec(ctx, `ANALYZE outbox.pending`); err != nil {
		t.Fatal(err)
	}

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	fetched := func() int64 {
		t.Helper()
		var n int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
			WHERE relid = 'outbox.pending'::regclass`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := fetched()
	got, err := lease.NewStore(tx).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: batch, MaxRun: perKey, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	read := fetched() - before
	heads, followers := lockedByClaim(t, tx)

	// Three keys' whole runs and the first 10 of a fourth's.
	groups := byKey(got)
	if len(got) != batch || len(groups) != 4 {
		t.Fatalf("claimed %d messages of %d keys, want 3 runs of %d and 10 of a fourth", len(got), len(groups), perKey)
	}
	var lengths []int
	for key, msgs := range groups {
		seq := sequences(msgs)
		for i, n := range seq {
			if n != int64(i+1) {
				t.Fatalf("%s: run %v, want sequences from 1 on", key, seq)
			}
		}
		lengths = append(lengths, len(seq))
	}
	slices.Sort(lengths)
	if !slices.Equal(lengths, []int{10, perKey, perKey, perKey}) {
		t.Fatalf("runs of %v messages, want 3 of %d and one of 10", lengths, perKey)
	}
	// Each head of the batch read once, each follower taken read and
	// locked once, and the lease written by primary key: at most 4 rows
	// per message. Expanding a run behind every head would be ~60.
	if read > 5*batch {
		t.Errorf("the claim fetched %d rows of outbox.pending for %d messages: it read runs it did not take", read, batch)
	}
	if followers != 0 {
		t.Errorf("the claim locked %d followers it did not take", followers)
	}
	// Nor a head it did not take: a concurrent claim skips a locked head,
	// and with it the key's whole run, until this claim commits.
	if heads != 0 {
		t.Errorf("the claim locked %d heads it did not take, hiding their keys from concurrent claims", heads)
	}
	t.Logf("a claim of %d fetched %d rows of outbox.pending and locked %d heads it did not take", batch, read, heads)
}

// Keys of one message each (per-entity keys) are claimed as their heads,
// within the byte budget, like unordered messages.
func TestKeysOfOneMessageAreClaimedAsTheirHeads(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 30, func(i int) outbox.Message {
		return outbox.Message{Namespace: "orders", Topic: "placed", OrderingKey: fmt.Sprintf("order-%d", i), Payload: json.RawMessage(`{"n":1}`)}
	})
	got := claimRun(t, store, "w", 20, 10)
	if len(got) != 20 {
		t.Fatalf("claimed %d, want 20 heads", len(got))
	}
	if keys := byKey(got); len(keys) != 20 || keys[""] != nil {
		t.Fatalf("claimed %d keys' messages, want 20 keys' heads", len(keys))
	}
	for _, m := range got {
		if m.SequenceID != 1 {
			t.Fatalf("claimed sequence %d of %s, its only message is 1", m.SequenceID, m.OrderingKey)
		}
	}
	budget, err := store.ClaimBatch(context.Background(), lease.ClaimParams{WorkerID: "w", BatchSize: 20, MaxRun: 10,
		Lease: time.Minute, MaxBytes: int64(3*got[0].PayloadBytes + 1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(budget) != 3 {
		t.Fatalf("claimed %d within a budget of three payloads", len(budget))
	}
}

// A run's messages are not locked by the claim that takes them (their
// head's lock keeps every other claim off the key), so an operator's
// discard of one of them takes the key's head first. While a discard of a
// key's fourth message is uncommitted, no claim takes the key; once it
// commits, the run goes on without that message. And a discard that comes
// while a claim is taking the run waits for it, then finds the message
// leased with its head and leaves it alone.
func TestDiscardAndClaimOfARunExcludeEachOther(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	msgs := enqueue(t, db.Pool, 8, ordered("payments", "acct-7"))
	store := lease.NewStore(db.Pool)

	operator, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer operator.Rollback(ctx) //nolint:errcheck
	var n int
	if err := operator.QueryRow(ctx, `SELECT count(*) FROM outbox.discard(ARRAY[$1]::uuid[], 'bad amount')`, msgs[3].ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("discard of sequence 4: %d %v, want 1", n, err)
	}
	if seq := sequences(claimRun(t, store, "w", 100, 10)); len(seq) != 0 {
		t.Fatalf("a claim took %v while a discard of the key's fourth message was uncommitted", seq)
	}
	if err := operator.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	first := claimRun(t, store, "w", 3, 10)
	if seq := sequences(first); !slices.Equal(seq, []int64{1, 2, 3}) {
		t.Fatalf("after the discard: %v, want 1-3", seq)
	}

	// The claim of the rest (5-8) is uncommitted when the discard of 6
	// starts: the discard waits for it, then leaves 6 to the claim.
	if _, err := store.CompleteBatch(ctx, "w", dispatched(first)); err != nil {
		t.Fatal(err)
	}
	claimer, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer claimer.Rollback(ctx) //nolint:errcheck
	rest := claimRun(t, lease.NewStore(claimer), "w", 100, 10)
	if seq := sequences(rest); !slices.Equal(seq, []int64{5, 6, 7, 8}) {
		t.Fatalf("the rest: %v, want 5-8", seq)
	}
	discarded := make(chan int, 1)
	go func() {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox.discard(ARRAY[$1]::uuid[], 'bad amount')`, msgs[5].ID).Scan(&n); err != nil {
			n = -1
		}
		discarded <- n
	}()
	select {
	case n := <-discarded:
		t.Fatalf("the discard of 6 returned %d before the claim of its run committed", n)
	case <-time.After(300 * time.Millisecond):
	}
	if err := claimer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := <-discarded; n != 0 {
		t.Fatalf("the discard of 6 discarded %d while 6 was leased with its run, want 0", n)
	}
	got, err := store.CompleteBatch(ctx, "w", dispatched(rest))
	if err != nil || slices.ContainsFunc(got, func(c lease.Completion) bool { return c.Status != outboxtype.StatusOK }) {
		t.Fatalf("the run of 5-8 after the discard attempt: %v %v", got, err)
	}
}

// An ordered claim keeps to its byte budget as an unordered one does: a
// prefix of each run up to the budget, an oversize payload claimed without
// it and not counted.
func TestOrderedRunsKeepToTheByteBudget(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.limits SET max_payload_bytes = 1048576`); err != nil {
		t.Fatal(err)
	}
	kib := func(n int, fill string) json.RawMessage {
		return json.RawMessage(`{"blob":"` + strings.Repeat(fill, n<<10-12) + `"}`)
	}
	// Two keys of 6 messages of 100 KiB, interleaved; acct-1's third is
	// 500 KiB, more than any route may send.
	var msgs []outbox.Message
	for i := range 12 {
		m := outbox.Message{Namespace: "billing", Topic: "usage", OrderingKey: fmt.Sprintf("acct-%d", i%2+1), Payload: kib(100, "y")}
		if i == 4 {
			m.Payload = kib(500, "z")
		}
		msgs = append(msgs, m)
	}
	if _, err := (outbox.Producer{Limits: outbox.Limits{MaxPayloadBytes: 1 << 20}}).EnqueueBatch(ctx, db.Pool, msgs); err != nil {
		t.Fatal(err)
	}
	got, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 100, MaxRun: 10, Lease: time.Minute,
		MaxPayloadBytes: 200 << 10, MaxBytes: 850 << 10})
	if err != nil {
		t.Fatal(err)
	}
	groups := byKey(got)
	// acct-1's run whole (5 × 100 KiB, its 500 KiB without payload), then
	// 3 of acct-2's within the 850 KiB left: 8 × 100 KiB.
	if seq := sequences(groups["acct-1"]); !slices.Equal(seq, []int64{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("acct-1: run %v, want 1-6", seq)
	}
	if seq := sequences(groups["acct-2"]); !slices.Equal(seq, []int64{1, 2, 3}) {
		t.Fatalf("acct-2: run %v, want 1-3 (the budget is spent)", seq)
	}
	for _, m := range got {
		if m.PayloadOmitted() != (m.OrderingKey == "acct-1" && m.SequenceID == 3) {
			t.Errorf("%s %d: payload omitted %t", m.OrderingKey, m.SequenceID, m.PayloadOmitted())
		}
	}
}

// A key's dead message replayed while a later message of the key is in
// flight waits for it: two claims are never in flight on one key, and the
// replayed message is delivered as the key's next one, its REPLAYED outcome
// saying it is out of sequence.
func TestReplayWaitsForTheKeysHeadInFlight(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 3, ordered("payments", "acct-1"))

	one := claimRun(t, store, "w1", 10, 1)
	if _, err := store.CompleteBatch(ctx, "w1", []lease.Result{{ID: one[0].ID, LeaseToken: one[0].LeaseToken, Outcome: outboxtype.OutcomeFailed, ErrorCode: "TARGET_REJECTED", OnDead: outboxtype.OnDeadSkip}}); err != nil {
		t.Fatal(err)
	}
	two := claimRun(t, store, "w1", 10, 1)
	if len(two) != 1 || two[0].SequenceID != 2 {
		t.Fatalf("after 1 died (skip): %v, want 2", sequences(two))
	}
	if _, err := store.ReplayDead(ctx, lease.ReplayRequest{MessageIDs: []uuid.UUID{one[0].ID}, Limit: 10, Reason: "fixed"}); err != nil {
		t.Fatal(err)
	}
	if got := claimRun(t, store, "w2", 10, 10); len(got) != 0 {
		t.Fatalf("claimed sequence %d while sequence 2 of the key is in flight", got[0].SequenceID)
	}
	if n := count(t, db.Pool, `SELECT count(DISTINCT lease_token) FROM outbox.pending WHERE ordering_key = 'acct-1' AND lease_token IS NOT NULL`); n > 1 {
		t.Fatalf("%d claims in flight on one key", n)
	}
	if _, err := store.CompleteBatch(ctx, "w1", dispatched(two)); err != nil {
		t.Fatal(err)
	}
	next := claimRun(t, store, "w2", 10, 10)
	if got := sequences(next); !slices.Equal(got, []int64{1, 3}) {
		t.Fatalf("after 2 was delivered: %v, want the replayed 1, then 3", got)
	}
	hist, err := store.MessageAttempts(ctx, one[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	replayed := hist[len(hist)-1]
	if replayed.State != "REPLAYED" || !strings.Contains(replayed.Note, "out of sequence") || replayed.DBUser == "" {
		t.Fatalf("REPLAYED outcome %+v, want a note that it is out of sequence and the database login", replayed)
	}
}

// on_dead = park: a dead head holds its key; replaying it releases the key
// in order (it goes first); discarding it (with a reason, audited) lets
// the next message go.
func TestParkHoldsTheKeyUntilReplayOrDiscard(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 4, ordered("payments", "acct-7"))

	die := func(m outboxtype.Message) {
		t.Helper()
		if _, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeFailed,
			ErrorCode: "TARGET_REJECTED", ErrorMessage: "refused", OnDead: outboxtype.OnDeadPark}}); err != nil {
			t.Fatal(err)
		}
	}
	head := claimRun(t, store, "w", 10, 1)
	die(head[0])
	if got := claimRun(t, store, "w", 10, 10); len(got) != 0 {
		t.Fatalf("claimed sequence %d of a parked key", got[0].SequenceID)
	}
	blocked, err := store.BlockedKeys(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocked) != 1 || blocked[0].State != lease.BlockedParked || blocked[0].MessageID != head[0].ID || blocked[0].Waiting != 3 {
		t.Fatalf("blocked keys %+v, want acct-7 parked on sequence 1 with 3 waiting", blocked)
	}
	stats, err := store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats[0].BlockedKeys != 1 || stats[0].Due != 0 {
		t.Fatalf("stats %+v, want one blocked key and nothing due", stats[0])
	}

	// Replayed, the dead head goes first and the key continues in order.
	if _, err := store.ReplayDead(ctx, lease.ReplayRequest{MessageIDs: []uuid.UUID{head[0].ID}, Limit: 10, Reason: "fixed the receiver"}); err != nil {
		t.Fatal(err)
	}
	run := claimRun(t, store, "w", 10, 10)
	if got := sequences(run); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Fatalf("after the replay: %v, want 1-4", got)
	}
	// 1 is delivered; 2 dies and parks again; the rest are released.
	results := []lease.Result{
		{ID: run[0].ID, LeaseToken: run[0].LeaseToken, Outcome: outboxtype.OutcomeDispatched},
		{ID: run[1].ID, LeaseToken: run[1].LeaseToken, Outcome: outboxtype.OutcomeFailed, ErrorCode: "TARGET_REJECTED", OnDead: outboxtype.OnDeadPark},
		{ID: run[2].ID, LeaseToken: run[2].LeaseToken, Outcome: outboxtype.OutcomeReleased},
		{ID: run[3].ID, LeaseToken: run[3].LeaseToken, Outcome: outboxtype.OutcomeReleased},
	}
	if _, err := store.CompleteBatch(ctx, "w", results); err != nil {
		t.Fatal(err)
	}
	if got := claimRun(t, store, "w", 10, 10); len(got) != 0 {
		t.Fatalf("claimed sequence %d while 2 holds the key", got[0].SequenceID)
	}

	// Discarding needs a reason; with one, the key goes on with 3.
	if _, err := store.Discard(ctx, lease.DiscardRequest{MessageIDs: []uuid.UUID{run[1].ID}}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("discard without a reason: %v, want refused", err)
	}
	gone, err := store.Discard(ctx, lease.DiscardRequest{MessageIDs: []uuid.UUID{run[1].ID}, Reason: "duplicate of refund 991", Operator: "oncall-ana"})
	if err != nil || len(gone) != 1 || gone[0].From != lease.StateDead {
		t.Fatalf("discard: %+v %v", gone, err)
	}
	hist, err := store.MessageAttempts(ctx, run[1].ID)
	if err != nil {
		t.Fatal(err)
	}
	last := hist[len(hist)-1]
	if last.State != "DISCARDED" || last.Operator != "oncall-ana" || last.Reason != "duplicate of refund 991" || last.DBUser == "" {
		t.Fatalf("the discard's outcome %+v, want DISCARDED with operator, reason and login", last)
	}
	if got := sequences(claimRun(t, store, "w", 10, 10)); !slices.Equal(got, []int64{3, 4}) {
		t.Fatalf("after the discard: %v, want 3 and 4", got)
	}
}

// Ordering keys are scoped by namespace: the same key in two namespaces is
// two keys, each with its own sequence and head.
func TestOrderingKeysAreScopedByNamespace(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := lease.NewStore(db.Pool)
	a := enqueue(t, db.Pool, 2, ordered("billing", "tenant-42"))
	b := enqueue(t, db.Pool, 2, ordered("payments", "tenant-42"))
	if a[0].SequenceID != 1 || b[0].SequenceID != 1 {
		t.Fatalf("sequence ids %d and %d, want each namespace's key to start at 1", a[0].SequenceID, b[0].SequenceID)
	}
	got := claimRun(t, store, "w", 10, 1)
	if len(got) != 2 || got[0].Namespace == got[1].Namespace {
		t.Fatalf("claimed %v: want one head per namespace", got)
	}
}

// A payload larger than any route may send is claimed without it, and does
// not count against the claim's byte budget; the budget bounds the rest.
func TestClaimNeverLoadsOversizePayloadsAndKeepsToItsBudget(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	// A database whose producers may write 8 MiB, three of them, between
	// ordinary messages of 100 KiB.
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.limits SET max_payload_bytes = 8388608`); err != nil {
		t.Fatal(err)
	}
	huge := json.RawMessage(`{"blob":"` + strings.Repeat("x", 8<<20-20) + `"}`)
	medium := json.RawMessage(`{"blob":"` + strings.Repeat("y", 100<<10) + `"}`)
	var msgs []outbox.Message
	for i := range 23 {
		p := medium
		if i%8 == 0 {
			p = huge
		}
		msgs = append(msgs, outbox.Message{Namespace: "billing", Topic: "usage", Payload: p})
	}
	if _, err := (outbox.Producer{Limits: outbox.Limits{MaxPayloadBytes: 8 << 20}}).EnqueueBatch(ctx, db.Pool, msgs); err != nil {
		t.Fatal(err)
	}
	// The claim's order: the claim index's.
	type queued struct {
		id    uuid.UUID
		bytes int
	}
	rows, err := db.Pool.Query(ctx, `SELECT id, payload_bytes FROM outbox.pending ORDER BY next_attempt_at, id`)
	if err != nil {
		t.Fatal(err)
	}
	queue, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (q queued, err error) {
		return q, r.Scan(&q.id, &q.bytes)
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 100, Lease: time.Minute,
		MaxPayloadBytes: 1 << 20, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// The claim is the longest prefix of the queue within the budget, the
	// oversize payloads counting for nothing.
	want, budget := 0, 0
	for _, q := range queue {
		if q.bytes <= 1<<20 {
			if budget+q.bytes > 1<<20 {
				break
			}
			budget += q.bytes
		}
		want++
	}
	claimed := make(map[uuid.UUID]bool, len(got))
	for _, m := range got {
		claimed[m.ID] = true
	}
	for i, q := range queue[:want] {
		if !claimed[q.id] {
			t.Errorf("message %d of the queue was not claimed, want the first %d of %d", i, want, len(queue))
		}
	}
	if len(got) != want {
		t.Errorf("claimed %d messages, want the first %d of the queue", len(got), want)
	}
	var omitted, loaded, bytes int
	for _, m := range got {
		if m.PayloadOmitted() {
			omitted++
			if m.PayloadBytes < 8<<20-20 {
				t.Errorf("an omitted payload reports %d bytes", m.PayloadBytes)
			}
			continue
		}
		loaded++
		bytes += len(m.Payload)
	}
	if omitted != 2 || bytes > 1<<20 || loaded < 9 {
		t.Fatalf("claimed %d: %d oversize without payload, %d loaded with %d bytes; want the oversize ones in the claim's order omitted and at most 1 MiB loaded",
			len(got), omitted, loaded, bytes)
	}
}

// A row the dispatcher cannot decode fails alone: the claim returns every
// message, the bad one marked.
func TestUndecodableRowIsAMessageNotAClaimFailure(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 9, plain)
	// A row from before the database refused such headers.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox.pending (id, namespace, topic, payload, payload_bytes, headers)
		VALUES (outbox.uuid_v7(), 'billing', 'usage', '{"n":9}', 7, '{"retries": 3}')`); err != nil {
		t.Fatal(err)
	}
	got, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
	if err != nil {
		t.Fatalf("one undecodable row failed the claim: %v", err)
	}
	bad := 0
	for _, m := range got {
		if m.DecodeError != nil {
			bad++
		}
	}
	if len(got) != 10 || bad != 1 {
		t.Fatalf("claimed %d with %d undecodable, want 10 with 1", len(got), bad)
	}
}

// What the Go producer refuses, the SQL functions refuse too, with SQLSTATE
// P7004 naming the field, and nothing written.
func TestDatabaseRefusesWhatTheProducerRefuses(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	for _, c := range []struct {
		name, sql, column, says string
	}{
		{"a header that is a number", `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}', p_headers => '{"retries": 3}')`, "headers", `value of retries must be a string, got number`},
		{"too many headers", `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}', p_headers => (SELECT jsonb_object_agg('h' || g, 'v') FROM generate_series(1, 17) g))`, "headers", "more than the limit of 16"},
		{"a reserved header", `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}', p_headers => '{"webhook-id": "x"}')`, "headers", "reserved"},
		{"a header value with a newline", `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}', p_headers => jsonb_build_object('x-a', E'a\nb'))`, "headers", "control character"},
		{"a payload over the limit", `SELECT * FROM outbox.enqueue('billing', 'usage', jsonb_build_object('b', repeat('x', 300000)))`, "payload", "over the limit of 262144"},
		{"a 100 MB payload", `SELECT * FROM outbox.enqueue_batch(ARRAY['billing'], ARRAY['usage'], ARRAY['{"b":"' || repeat('x', 100000000) || '"}'])`, "payload", "over the limit"},
		{"a string payload", `SELECT * FROM outbox.enqueue('billing', 'usage', '"hello"')`, "payload", "object or array"},
		{"an invalid JSON payload in a batch", `SELECT * FROM outbox.enqueue_batch(ARRAY['billing', 'billing'], ARRAY['usage', 'usage'], ARRAY['{"n":1}', '{"n":'])`, "payload", "not valid JSON"},
		{"an ordering key over 512 bytes", `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}', p_ordering_key => repeat('k', 513))`, "ordering_key", "over the limit of 512"},
		{"a dedupe key with a control character", `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}', p_dedupe_key => E'a\tb')`, "dedupe_key", "control character"},
		{"available_at infinity", `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}', p_ordering_key => 'acct-9', p_available_at => 'infinity')`, "available_at", "finite"},
		{"available_at beyond the bound", `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}', p_available_at => now() + interval '2 years')`, "available_at", "ahead"},
		{"a namespace with a space", `SELECT * FROM outbox.enqueue('bill ing', 'usage', '{"n":1}')`, "namespace", "letters, digits"},
		{"a trace header with a space", `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}', p_trace_header => 'Root=1 2')`, "trace_header", "printable ASCII"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := db.Pool.Exec(ctx, c.sql)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "P7004" || pgErr.ColumnName != c.column || !strings.Contains(pgErr.Message, c.says) {
				t.Fatalf("%v, want SQLSTATE P7004 on column %s saying %q", err, c.column, c.says)
			}
		})
	}
	if n := count(t, db.Pool, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.sequences) + (SELECT count(*) FROM outbox.dedupe)`); n != 0 {
		t.Fatalf("refused enqueues wrote %d rows", n)
	}
	// And a batch names the message at fault.
	_, err := db.Pool.Exec(ctx, `SELECT * FROM outbox.enqueue_batch(ARRAY['billing', 'billing', 'billing'], ARRAY['usage', 'usage', 'usage'],
		ARRAY['{"n":1}', '{"n":2}', '{"n":3}'], p_headers => ARRAY[NULL, NULL, '{"retries": 3}'])`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !strings.Contains(pgErr.Message, "invalid message 2") || pgErr.Detail != "message index: 2" {
		t.Fatalf("%v, want the error to name message 2", err)
	}
}

// An idle key's bookkeeping is forgotten after the retention window, in two
// passes (the sequence floor first); a key that comes back continues with
// higher sequence ids.
func TestIdleKeysAreForgottenAndComeBackHigher(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 5, ordered("billing", "tenant-1"))
	for {
		got := claimRun(t, store, "w", 10, 10)
		if len(got) == 0 {
			break
		}
		if _, err := store.CompleteBatch(ctx, "w", dispatched(got)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.sequences SET updated_at = now() - interval '40 days'`); err != nil {
		t.Fatal(err)
	}
	purge := func() int64 {
		t.Helper()
		res, err := store.Purge(ctx, lease.PurgeParams{KeysOlderThan: 30 * 24 * time.Hour, MaxRows: 100})
		if err != nil {
			t.Fatal(err)
		}
		return res.Keys
	}
	if n := purge(); n != 0 {
		t.Fatalf("the first pass forgot %d keys before raising the sequence floor", n)
	}
	if n := purge(); n != 1 {
		t.Fatalf("the second pass forgot %d keys, want 1", n)
	}
	if n := count(t, db.Pool, `SELECT (SELECT count(*) FROM outbox.sequences) + (SELECT count(*) FROM outbox.keys)`); n != 0 {
		t.Fatalf("%d bookkeeping rows left", n)
	}
	back := enqueue(t, db.Pool, 1, ordered("billing", "tenant-1"))
	if back[0].SequenceID <= 5 {
		t.Fatalf("the key came back at sequence %d, not above its last (5)", back[0].SequenceID)
	}
	if got := claimRun(t, store, "w", 10, 10); len(got) != 1 || got[0].ID != back[0].ID {
		t.Fatalf("the returning key's message is not claimable: %v", got)
	}
}

// A producer committing to a key whose last message a dispatcher is
// completing at that moment never leaves its message without a head.
func TestProducerAndCompletionRaceNeverStrandsAKey(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 8 })
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	const rounds = 200
	for i := range rounds {
		key := fmt.Sprintf("k-%d", i)
		enqueue(t, db.Pool, 1, ordered("billing", key))
		msgs := claimRun(t, store, "w", 10, 10)
		done := make(chan error, 1)
		go func() {
			_, err := store.CompleteBatch(ctx, "w", dispatched(msgs))
			done <- err
		}()
		enqueue(t, db.Pool, 1, ordered("billing", key))
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		got := claimRun(t, store, "w", 10, 10)
		if len(got) != 1 {
			// Settled by a later claim at the latest.
			got = claimRun(t, store, "w", 10, 10)
		}
		if len(got) != 1 || got[0].OrderingKey != key || got[0].SequenceID != 2 {
			t.Fatalf("round %d: claimed %v, want sequence 2 of %s", i, sequences(got), key)
		}
		if _, err := store.CompleteBatch(ctx, "w", dispatched(got)); err != nil {
			t.Fatal(err)
		}
	}
}

// claimOf100ReadingTuples claims up to 100 messages in a transaction it
// rolls back, and returns them with the tuples the claim read from
// outbox.pending — through its indexes and by sequential scans alike —
// counted by the claiming transaction's own statistics, which no other
// session touches and no flush delays. It fails the test when the count is
// below the rows taken: such a count measured nothing, and proves nothing.
func claimOf100ReadingTuples(ctx context.Context, t *testing.T, pool *pgxpool.Pool) ([]outboxtype.Message, int64) {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	read := func() int64 {
		t.Helper()
		var n int64
		if err := tx.QueryRow(ctx, `SELECT
			(SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0) FROM pg_index i
			 WHERE i.indrelid = 'outbox.pending'::regclass)
			+ pg_stat_get_xact_tuples_returned('outbox.pending'::regclass)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := read()
	got, err := lease.NewStore(tx).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 100, MaxRun: 100, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	delta := read() - before
	if delta < int64(len(got)) {
		t.Fatalf("the statistics count %d tuples read by a claim that took %d rows: the measurement is broken", delta, len(got))
	}
	return got, delta
}

// A claim of ordered runs writes one row per run, not one per message: the
// head is leased for its run, and the messages behind it are read. 40 keys
// of 25 in a claim of 1,000 update 40 rows (leasing each message updated 1,000); the
// claim still hands out all 1,000 under its token, with the attempt each
// will be charged.
func TestAClaimOfRunsWritesOnlyTheirHeads(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	const keys, perKey = 40, 25
	enqueue(t, db.Pool, keys*perKey, func(i int) outbox.Message {
		return ordered("payments", fmt.Sprintf("acct-%d", i%keys))(i)
	})
	// Keys left unsettled by their producers' concurrent commits are
	// settled by the next claim (writing their heads): not this claim's
	// cost.
	if _, err := db.Pool.Exec(ctx, `SELECT outbox.settle_unsettled(1000)`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	// The session's counts not yet reported include its earlier
	// transactions' (PostgreSQL 15 reports them at most once a second):
	// the claim's are the difference.
	updates := func() int {
		t.Helper()
		var n int
		if err := tx.QueryRow(ctx, `SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE schemaname = 'outbox' AND relname = 'pending'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := updates()
	got := claimRun(t, lease.NewStore(tx), "w", keys*perKey, perKey)
	if len(got) != keys*perKey {
		t.Fatalf("claimed %d, want %d", len(got), keys*perKey)
	}
	for _, m := range got {
		if m.LeaseToken != got[0].LeaseToken || m.Attempt != 1 {
			t.Fatalf("sequence %d of %s: token %s attempt %d, want the claim's token and attempt 1", m.SequenceID, m.OrderingKey, m.LeaseToken, m.Attempt)
		}
	}
	if updated := updates() - before; updated != keys {
		t.Fatalf("the claim updated %d rows of outbox.pending, want %d (one per run)", updated, keys)
	}
}

// A run's outcomes recorded one message at a time, in order (outbox.complete
// per message, as a producer-side tool in another language might), keep the
// run's lease: the next message takes it over when the one before leaves,
// so no other claim takes the key meanwhile and every outcome is accepted.
// A run whose head is rescheduled alone ends there: its later messages,
// never recorded, are the key's again, and the old token no longer fences
// them.
func TestARunRecordedOneMessageAtATimeKeepsItsLease(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 5, ordered("payments", "acct-1"))
	run := claimRun(t, store, "w1", 10, 10)
	if seq := sequences(run); !slices.Equal(seq, []int64{1, 2, 3, 4, 5}) {
		t.Fatalf("claimed %v, want 1-5", seq)
	}
	for i, m := range run[:3] {
		if status, err := store.Complete(ctx, "w1", dispatched([]outboxtype.Message{m})[0]); err != nil || status != outboxtype.StatusOK {
			t.Fatalf("sequence %d alone: %s %v", m.SequenceID, status, err)
		}
		if other := claimRun(t, store, "w2", 10, 10); len(other) != 0 {
			t.Fatalf("after %d of the run recorded, another claim took %v", i+1, sequences(other))
		}
	}
	// Sequence 4 fails alone; 5 is not recorded: the run ends.
	failed := lease.Result{ID: run[3].ID, LeaseToken: run[3].LeaseToken, Outcome: outboxtype.OutcomeRetryable,
		ErrorCode: "HTTP_503", RetryAt: time.Now()}
	if status, err := store.Complete(ctx, "w1", failed); err != nil || status != outboxtype.StatusOK {
		t.Fatalf("sequence 4 retryable: %s %v", status, err)
	}
	if got, err := store.CompleteBatch(ctx, "w1", dispatched(run[4:])); err != nil || got[0].Status != outboxtype.StatusLeaseLost {
		t.Fatalf("sequence 5 after its run ended: %v %v, want lease_lost", got, err)
	}
	if seq := sequences(claimRun(t, store, "w2", 10, 10)); !slices.Equal(seq, []int64{4, 5}) {
		t.Fatalf("the key's next claim: %v, want 4 and 5", seq)
	}
	attempts := map[int64]int{}
	rows, err := db.Pool.Query(ctx, `SELECT sequence_id, attempt_no FROM outbox.attempts WHERE ordering_key = 'acct-1' ORDER BY sequence_id, id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var seq int64
		var n int
		if err := rows.Scan(&seq, &n); err != nil {
			t.Fatal(err)
		}
		attempts[seq] = n
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if want := map[int64]int{1: 1, 2: 1, 3: 1, 4: 1}; !maps.Equal(attempts, want) {
		t.Fatalf("archived attempts by sequence: %v, want %v", attempts, want)
	}
}

// A run's completion fences each of its messages by one probe of its key's
// head, whatever the key delivered before: a hot key's run behind 3,000 of
// its messages already delivered costs what it costs on a fresh key.
// Measured as buffer accesses of the key's sequence index, not as time: a probe of
// the key's sequence from its start stepped over every delivered message
// still in the index (quadratic in the key's backlog: a hot key's
// completion took 120 ms).
func TestARunsCompletionDoesNotReadWhatItsKeyDelivered(t *testing.T) {
	t.Parallel()
	// One connection, so that every count the server has is this test's
	// statements' once that connection flushed its own.
	db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 3200, ordered("payments", "acct-hot"))
	for range 3 {
		run := claimRun(t, store, "w", 1000, 1000)
		if _, err := store.CompleteBatch(ctx, "w", dispatched(run)); err != nil {
			t.Fatal(err)
		}
	}
	run := claimRun(t, store, "w", 200, 200)
	if len(run) != 200 {
		t.Fatalf("claimed %d, want the run of 200", len(run))
	}
	// Buffer accesses of the key's sequence index, as the server counts
	// them: a session's counts reach it when the session flushes them,
	// which pg_stat_force_next_flush makes happen at the end of its next
	// transaction.
	blocks := func() int {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes
			WHERE schemaname = 'outbox' AND indexrelname = 'pending_key_sequence'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := blocks()
	got, err := store.CompleteBatch(ctx, "w", dispatched(run))
	if err != nil || slices.ContainsFunc(got, func(c lease.Completion) bool { return c.Status != outboxtype.StatusOK }) {
		t.Fatalf("completion: %v %v", got, err)
	}
	if n := blocks() - before; n > 200 {
		t.Fatalf("the completion of a run of 200 read pending_key_sequence %d times (buffer accesses), want a few per key", n)
	}
}
