package functions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
	"github.com/outboxkit/dispatcher/shared/handler/metricsfn"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgbouncer"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// pooledEnv is a function's environment reaching the database through a
// transaction pooler at url: the one setting that says so, nothing else.
func pooledEnv(url string, extra ...string) []string {
	return append([]string{
		"OUTBOX_DATABASE_URL=" + url,
		"OUTBOX_DB_POOLER=transaction",
		"OUTBOX_TRACING=off",
		"OUTBOX_FUNCTION_TIMEOUT=60s",
		"SINK_SECRET=" + sinkSecret,
	}, extra...)
}

// producerPool is a producer service's pool through the pooler at url.
// Behind a transaction pooler that keeps no prepared statements (PgBouncer
// before 1.21, or with max_prepared_statements = 0, its default), a
// producer uses the simple protocol or pgx's exec mode, which prepares
// nothing named.
func producerPool(t *testing.T, url, mode string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url+"&default_query_exec_mode="+mode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Through PgBouncer in transaction mode with its default configuration, a
// producer service enqueues in its own transactions, and the dispatch,
// metrics, replay and reaper bootstraps do their work, each configured
// with OUTBOX_DB_POOLER=transaction alone. The statement timeout still
// holds there.
func TestBehindPgBouncerTheProducerAndEveryFunctionWork(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	url := pgbouncer.Start(t).URL(t, db.URL)
	snk := newSink(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE public.invoices (id int PRIMARY KEY, total int NOT NULL)"); err != nil {
		t.Fatal(err)
	}

	// The producer: the business change and its message in one
	// transaction, one message at a time or in a batch; a rolled-back
	// transaction leaves neither.
	invoice := func(i int) outbox.Message {
		m := usage(i)
		if i%20 == 7 {
			m.Payload = json.RawMessage(fmt.Sprintf(`{"turn":%d,"poison":true}`, i)) // the plugin refuses it
		}
		return m
	}
	commit := func(pool *pgxpool.Pool, ids []int, rollback bool) {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var msgs []outbox.Message
			for _, id := range ids {
				if _, err := tx.Exec(ctx, "INSERT INTO public.invoices VALUES ($1, $2)", id, 100+id); err != nil {
					return err
				}
				msgs = append(msgs, invoice(id))
			}
			if len(msgs) == 1 {
				if _, err := outbox.Enqueue(ctx, tx, msgs[0]); err != nil {
					return err
				}
			} else if _, err := outbox.EnqueueBatch(ctx, tx, msgs); err != nil {
				return err
			}
			if rollback {
				return errRollback
			}
			return nil
		})
		if err != nil && !(rollback && err == errRollback) {
			t.Fatalf("producer: %v", err)
		}
	}
	ids := func(from, to int) []int {
		var out []int
		for i := from; i < to; i++ {
			out = append(out, i)
		}
		return out
	}
	for _, mode := range []string{"simple_protocol", "exec"} {
		p := producerPool(t, url, mode)
		base := map[string]int{"simple_protocol": 0, "exec": 100}[mode]
		for i := base; i < base+30; i++ {
			commit(p, []int{i}, false)
		}
		commit(p, ids(base+30, base+60), false)
		commit(p, ids(base+60, base+70), true)
	}
	// 120 messages committed, 6 of them poison; 20 rolled back.
	const committed, poison = 120, 6
	if n := count(t, db.Pool, `SELECT count(*) FROM public.invoices`); n != committed {
		t.Fatalf("%d invoices, want %d", n, committed)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`); n != committed {
		t.Fatalf("%d messages pending, want %d: the outbox and the business change disagree", n, committed)
	}

	// dispatch: claims and completes through PgBouncer.
	dispatcher := start(t, "dispatch", pooledEnv(url, "OUTBOX_ROUTES="+snk.routes(), "OUTBOX_BATCH_SIZE=50")...)
	var sum dispatch.Summary
	invoke(t, dispatcher, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.Delivered != committed-poison || sum.Dead != poison || sum.LeaseLost != 0 || sum.StoppedBy != dispatch.StoppedDrained {
		t.Fatalf("dispatch through PgBouncer: %+v, want %d delivered and %d dead", sum, committed-poison, poison)
	}
	if handled, maxRequests := snk.counts(); handled != committed-poison || maxRequests != 1 {
		t.Fatalf("sink handled %d, at most %d requests per message; want %d exactly once", handled, maxRequests, committed-poison)
	}
	// Lingering, it polls: a transaction pooler cannot keep a LISTEN.
	lingering := start(t, "dispatch", pooledEnv(url, "OUTBOX_ROUTES="+snk.routes(),
		"OUTBOX_LINGER=on", "OUTBOX_POLL_INTERVAL=100ms", "OUTBOX_SAFETY_MARGIN=1s")...)
	var answer dispatchfn.Answer
	invoke(t, lingering, event(t, "dispatch-schedule.json"), 3*time.Second, &answer)
	if answer.NotifyWakeups != 0 || answer.Polls == 0 {
		t.Errorf("lingering through PgBouncer: %d NOTIFY wake-ups, %d polls; want polls only", answer.NotifyWakeups, answer.Polls)
	}

	// metrics
	var snap metricsfn.Snapshot
	invoke(t, start(t, "metrics", pooledEnv(url)...), event(t, "metrics-schedule.json"), 10*time.Second, &snap)
	if snap.Totals.Dead != poison || snap.Totals.Pending != 0 {
		t.Fatalf("metrics through PgBouncer: %+v, want %d dead and nothing pending", snap.Totals, poison)
	}

	// dlq-replay: a dry run, then the move.
	replay := start(t, "dlq-replay", pooledEnv(url)...)
	var replayed struct {
		Matched  int  `json:"matched"`
		Replayed int  `json:"replayed"`
		DryRun   bool `json:"dry_run"`
	}
	invoke(t, replay, []byte(`{"namespace":"billing","error_code":"TARGET_REJECTED"}`), 10*time.Second, &replayed)
	if !replayed.DryRun || replayed.Matched != poison {
		t.Fatalf("replay dry run through PgBouncer: %+v", replayed)
	}
	invoke(t, replay, []byte(`{"namespace":"billing","error_code":"TARGET_REJECTED","dry_run":false,"reason":"pooler test"}`), 10*time.Second, &replayed)
	if replayed.Replayed != poison {
		t.Fatalf("replay through PgBouncer: %+v, want %d moved", replayed, poison)
	}

	// reaper: the replayed messages claimed by a dispatcher that died,
	// their lease run out.
	claimed, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "ghost", BatchSize: 100, Lease: time.Minute})
	if err != nil || len(claimed) != poison {
		t.Fatalf("ghost claim: %d, %v", len(claimed), err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.pending SET lease_expires_at = now() - interval '1 second' WHERE lease_token IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	var reaped struct {
		Requeued int `json:"requeued"`
	}
	invoke(t, start(t, "reaper", pooledEnv(url)...), event(t, "reaper-schedule.json"), 10*time.Second, &reaped)
	if reaped.Requeued != poison {
		t.Fatalf("reaper through PgBouncer requeued %d, want %d", reaped.Requeued, poison)
	}

	// The statement timeout: a claim that waits on a lock longer than it
	// is cancelled by the server, through PgBouncer.
	lock, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck
	if _, err := lock.Exec(ctx, "LOCK TABLE outbox.pending IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	impatient := start(t, "dispatch", pooledEnv(url, "OUTBOX_ROUTES="+snk.routes(), "OUTBOX_DB_STATEMENT_TIMEOUT=300ms")...)
	r, err := impatient.Invoke(ctx, event(t, "dispatch-schedule.json"), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Err == nil || !strings.Contains(r.Err.Message, "statement timeout") || !strings.Contains(r.Err.Message, "57014") {
		t.Fatalf("a claim blocked past OUTBOX_DB_STATEMENT_TIMEOUT through PgBouncer: %s %v, want it cancelled (57014)", r.Body, r.Err)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Nothing was claimed meanwhile: the requeued messages are still due.
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NULL`); n != poison {
		t.Errorf("%d messages due after the cancelled claim, want %d", n, poison)
	}
	invoke(t, impatient, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.Claimed != poison {
		t.Errorf("the next invocation claimed %d, want the %d requeued", sum.Claimed, poison)
	}
}

var errRollback = fmt.Errorf("roll back")
