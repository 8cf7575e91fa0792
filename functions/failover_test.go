package functions_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// dispatchApplicationName is what the dispatch function's connections are
// called in pg_stat_activity.
const dispatchApplicationName = "outbox-dispatcher/dispatch"

// failover acts on the test's database from outside it, as a failover
// would: its statements run on the server's maintenance database, which
// the read-only setting does not touch.
type failover struct {
	t     *testing.T
	db    *pgtest.DB
	admin *pgx.Conn
}

func newFailover(t *testing.T, db *pgtest.DB) *failover {
	return &failover{t: t, db: db, admin: pgtest.Connect(t, pgtest.URL())}
}

// readOnly makes the database's new sessions read-only (on) or not (off),
// as a name resolving to a demoted primary, then to the new one, does.
func (f *failover) readOnly(on bool) {
	f.t.Helper()
	stmt := "ALTER DATABASE " + pgx.Identifier{f.db.Name}.Sanitize() + " RESET default_transaction_read_only"
	if on {
		stmt = "ALTER DATABASE " + pgx.Identifier{f.db.Name}.Sanitize() + " SET default_transaction_read_only = on"
	}
	if _, err := f.admin.Exec(context.Background(), stmt); err != nil {
		f.t.Fatal(err)
	}
}

// terminate ends every connection of the dispatch function, as the old
// primary going away does, and returns how many there were.
func (f *failover) terminate() int {
	f.t.Helper()
	var n int
	err := f.admin.QueryRow(context.Background(), `SELECT count(*) FROM (
		SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2) AS t`,
		f.db.Name, dispatchApplicationName).Scan(&n)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// A warm dispatch function whose server fails over: its connections are
// cut, and the name it connects to leads for a while to a read-only
// server. Its invocations fail then, writing nothing; once the name leads
// to a writable server again, the next invocation delivers everything —
// it does not go on failing on the read-only sessions its pool kept.
func TestWarmDispatchSurvivesTheServerTurningReadOnlyAndBack(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	fo := newFailover(t, db)
	ctx := context.Background()
	enqueue(t, db.Pool, 50, usage)
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+snk.routes())...)
	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.Delivered != 50 {
		t.Fatalf("before the failover: %+v", sum)
	}
	enqueue(t, db.Pool, 50, func(i int) outbox.Message { return usage(50 + i) })

	fo.readOnly(true)
	if n := fo.terminate(); n == 0 {
		t.Fatal("the warm function had no connection to cut")
	}
	// The first invocation may meet a cut connection (57P01) before its
	// pool reconnects to the read-only server; one soon meets 25006.
	readOnlySeen := false
	for attempt := 0; attempt < 3 && !readOnlySeen; attempt++ {
		r, err := fn.Invoke(ctx, event(t, "dispatch-schedule.json"), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if r.Err == nil {
			t.Fatalf("an invocation succeeded against a read-only server: %s", r.Body)
		}
		readOnlySeen = strings.Contains(r.Err.Message, "25006")
	}
	if !readOnlySeen {
		t.Fatal("no invocation met the read-only server (SQLSTATE 25006)")
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NULL AND attempt_count = 0`); n != 50 {
		t.Fatalf("%d of the 50 messages untouched during the failover, want all", n)
	}

	fo.readOnly(false)
	invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.Delivered != 50 || sum.LeaseLost != 0 {
		t.Fatalf("after the failover: %+v, want the 50 delivered: the pool kept its read-only connections", sum)
	}
	assertDeliveredOnce(t, db, snk, 100)
}

// Every connection of a dispatch function cut while a batch is in the
// target's hands: the batch is completed on new connections, or its
// leases run out and it is delivered again — never lost, and never
// delivered twice while its lease holds.
func TestBackendsTerminatedMidBatchLoseNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	fo := newFailover(t, db)
	ctx := context.Background()
	const total = 120
	enqueue(t, db.Pool, total, usage)
	snk.setDelay(300 * time.Millisecond)
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+snk.routes(), "OUTBOX_BATCH_SIZE=40")...)
	if _, err := fn.ColdStart(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	done := make(chan lambdatest.Response, 1)
	go func() {
		r, err := fn.Invoke(ctx, event(t, "dispatch-schedule.json"), 50*time.Second)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	select {
	case <-snk.started:
	case <-time.After(30 * time.Second):
		t.Fatalf("the dispatch never reached the sink\n%s", fn.Stdout())
	}
	if n := fo.terminate(); n == 0 {
		t.Fatal("the function had no connection to cut")
	}
	snk.setDelay(0)
	first := <-done
	t.Logf("the invocation cut mid-batch answered %s %v", first.Body, first.Err)

	// What it left leased waits for its lease; the test moves the expiry
	// into the past rather than wait, and those messages alone may come
	// twice.
	var expired []string
	rows, err := db.Pool.Query(ctx, `UPDATE outbox.pending SET lease_expires_at = now() - interval '1 second'
		WHERE lease_token IS NOT NULL RETURNING dedupe_key`)
	if err == nil {
		expired, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatal(err)
	}
	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 50*time.Second, &sum)
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`); n != 0 {
		t.Fatalf("%d messages still pending after the next invocation (%+v)", n, sum)
	}
	if n := count(t, db.Pool, `SELECT count(DISTINCT message_id) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != total {
		t.Fatalf("%d messages recorded delivered, want %d: a message was lost", n, total)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != total {
		t.Errorf("%d DISPATCHED attempts for %d messages", n, total)
	}
	handled, _ := snk.counts()
	if handled != total {
		t.Fatalf("sink handled %d distinct messages, want %d", handled, total)
	}
	snk.mu.Lock()
	defer snk.mu.Unlock()
	twice := map[string]bool{}
	for _, key := range expired {
		twice[key] = true
	}
	for key, n := range snk.requests {
		if n > 1 && !twice[key] {
			t.Errorf("message %s delivered %d times though its lease never ran out", key, n)
		}
	}
}

// assertDeliveredOnce checks that every one of total messages was
// delivered, recorded once, and received once.
func assertDeliveredOnce(t *testing.T, db *pgtest.DB, snk *webhookSink, total int) {
	t.Helper()
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`); n != 0 {
		t.Errorf("%d messages left pending", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != total {
		t.Errorf("%d DISPATCHED attempts, want %d", n, total)
	}
	if handled, maxRequests := snk.counts(); handled != total || maxRequests != 1 {
		t.Errorf("sink handled %d messages, at most %d requests each; want %d exactly once", handled, maxRequests, total)
	}
}
