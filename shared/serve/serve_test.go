package serve_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/serve"
	"github.com/outboxkit/dispatcher/shared/sink"
	"github.com/outboxkit/dispatcher/shared/testkit/emftest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

const sinkSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// testSink is a plugin endpoint: the reference receiver in front of a
// recorder of when each key arrived, optionally slowed down or hung.
type testSink struct {
	*httptest.Server
	mu       sync.Mutex
	arrived  map[string]time.Time
	requests int
	delay    time.Duration
	started  chan struct{}
	once     sync.Once
}

func newSink(t *testing.T, delay time.Duration) *testSink {
	t.Helper()
	secret, err := webhook.ParseSecret(sinkSecret)
	if err != nil {
		t.Fatal(err)
	}
	s := &testSink{arrived: map[string]time.Time{}, delay: delay, started: make(chan struct{})}
	receiver := sink.NewReceiver(secret, sink.NewMemoryDeduper(), func(_ context.Context, env publish.Envelope) error {
		s.mu.Lock()
		s.arrived[env.Key] = time.Now()
		s.mu.Unlock()
		return nil
	})
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.once.Do(func() { close(s.started) })
		s.mu.Lock()
		s.requests++
		s.mu.Unlock()
		// Reading the body first lets the server notice a sender that gives
		// up (it watches the connection only once the body is read).
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if s.delay > 0 {
			select {
			case <-time.After(s.delay):
			case <-r.Context().Done():
				return
			}
		}
		receiver.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *testSink) arrival(key string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.arrived[key]
	return at, ok
}

func (s *testSink) handled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.arrived)
}

// waitFor polls until key arrives or the bound passes.
func (s *testSink) waitFor(t *testing.T, key string, bound time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if at, ok := s.arrival(key); ok {
			return at
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%s not delivered within %s", key, bound)
	return time.Time{}
}

// environment is the dispatch function's environment against db and snk.
func environment(db *pgtest.DB, snk *testSink, extra map[string]string) config.Env {
	vars := map[string]string{
		"OUTBOX_DATABASE_URL": db.URL,
		"OUTBOX_TRACING":      "off",
		"OUTBOX_LOG_LEVEL":    "warn",
		"SINK_SECRET":         sinkSecret,
		"OUTBOX_ROUTES": fmt.Sprintf(`{"routes":[{"match":{"namespace":"billing","topic":"*"},
			"target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET","timeout":"30s"},
			"retry":{"max_attempts":5,"base_delay":"1s","max_delay":"10s"}}]}`, snk.URL+"/usage"),
	}
	for k, v := range extra {
		vars[k] = v
	}
	return config.Env{Getenv: func(k string) string { return vars[k] }}
}

// open loads the server's configuration from env as outboxctl serve does,
// and opens it.
func open(ctx context.Context, env config.Env, cfg serve.Config) (*serve.Server, func(), error) {
	setup, err := dispatchconfig.LoadServe(env, cfg.ReaperInterval > 0)
	if err != nil {
		return nil, nil, err
	}
	return serve.Open(ctx, setup, handler.Deps{Stdout: io.Discard}, cfg)
}

// start opens and runs a server; the returned function stops it and waits
// for Run to return.
func start(t *testing.T, env config.Env, cfg serve.Config) (*serve.Server, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, closeFn, err := open(ctx, env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(time.Minute):
				t.Error("Run did not return within a minute of its cancellation")
			}
			closeFn()
		})
	}
	t.Cleanup(stop)
	select {
	case <-s.Listening():
	case <-time.After(30 * time.Second):
		t.Fatal("the server never listened")
	}
	return s, stop
}

func message(key string) outbox.Message {
	return outbox.Message{Namespace: "billing", Topic: "usage_snapshot", DedupeKey: key,
		Payload: json.RawMessage(`{"tokens":1}`)}
}

func enqueue(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) {
	t.Helper()
	if _, err := outbox.EnqueueBatch(context.Background(), pool, msgs); err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// An hour-long poll interval means only a notification can explain a
// delivery within the bound.
const noPoll = time.Hour

// notifyBound is how long a notified delivery may take here. It is
// typically a few tens of milliseconds (the debounce, one claim, one HTTP
// call, one completion); the bound is far above that so that a slow or
// loaded machine does not fail the test, and far below noPoll so that the
// poll cannot pass it.
const notifyBound = time.Minute

func TestNotificationWakesAnIdleServer(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t, 0)
	s, _ := start(t, environment(db, snk, nil), serve.Config{PollInterval: noPoll})

	// Let the start-up drain and the catch-up after LISTEN pass: the server
	// is idle, waiting.
	time.Sleep(200 * time.Millisecond)
	for i := range 3 {
		key := fmt.Sprintf("idle-%d", i)
		enqueued := time.Now()
		enqueue(t, db.Pool, message(key))
		took := snk.waitFor(t, key, notifyBound).Sub(enqueued)
		t.Logf("enqueue → delivery: %s", took)
		time.Sleep(100 * time.Millisecond)
	}
	// The start-up drain may count as the one poll (or as the catch-up
	// wake-up after LISTEN, when that comes first).
	if polls := s.Totals().Polls; polls > 1 {
		t.Errorf("%d polls, want at most the one at start: a delivery came from polling", polls)
	}
	if s.Totals().Wakeups < 3 {
		t.Errorf("%d wake-ups for 3 notified messages", s.Totals().Wakeups)
	}
}

func TestPollDeliversWhenTheTriggerIsDisabled(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t, 0)
	if _, err := db.Pool.Exec(context.Background(), `ALTER TABLE outbox.pending DISABLE TRIGGER pending_notify`); err != nil {
		t.Fatal(err)
	}
	s, _ := start(t, environment(db, snk, nil), serve.Config{PollInterval: 300 * time.Millisecond})
	time.Sleep(200 * time.Millisecond)
	wakeupsBefore := s.Totals().Wakeups
	enqueue(t, db.Pool, message("no-notification"))
	snk.waitFor(t, "no-notification", 30*time.Second)
	if s.Totals().Wakeups != wakeupsBefore {
		t.Errorf("a notification arrived although the trigger is disabled")
	}
}

func TestListenerReconnectsAndCatchesUp(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t, 0)
	s, _ := start(t, environment(db, snk, nil), serve.Config{PollInterval: noPoll})
	ctx := context.Background()
	time.Sleep(200 * time.Millisecond)

	// Kill the listener's connection and commit a message at once, before
	// the listener can be back (its first reconnection waits 250ms): the
	// notification of that commit reaches no one. Only the catch-up drain
	// after the reconnection can deliver it, since the poll is an hour away.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, tx, message("while-deaf")); err != nil {
		t.Fatal(err)
	}
	var killed int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity a, pg_terminate_backend(a.pid) k
		WHERE a.datname = current_database() AND a.application_name = $1 AND k`, serve.ListenApplicationName).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d listener connections, want 1", killed)
	}
	snk.waitFor(t, "while-deaf", 30*time.Second)

	// Listening again: the next message is notified.
	deadline := time.Now().Add(30 * time.Second)
	for s.Totals().Reconnects < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.Totals().Reconnects != 1 {
		t.Fatalf("%d reconnections, want 1", s.Totals().Reconnects)
	}
	enqueue(t, db.Pool, message("after-reconnect"))
	snk.waitFor(t, "after-reconnect", notifyBound)
	if polls := s.Totals().Polls; polls > 1 {
		t.Errorf("%d polls, want at most the one at start", polls)
	}
}

// Cancelling Run mid-batch stops claiming but delivers and completes the
// batch in hand: nothing is left leased or retried.
func TestShutdownFinishesTheBatchInHand(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t, 300*time.Millisecond)
	var msgs []outbox.Message
	for i := range 100 {
		msgs = append(msgs, message(fmt.Sprintf("m-%d", i)))
	}
	enqueue(t, db.Pool, msgs...)
	s, stop := start(t, environment(db, snk, map[string]string{"OUTBOX_BATCH_SIZE": "20"}),
		serve.Config{PollInterval: noPoll})
	<-snk.started
	stop()

	delivered := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`)
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NOT NULL`); n != 0 {
		t.Errorf("%d messages left leased", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state <> 'DISPATCHED'`); n != 0 {
		t.Errorf("%d outcomes other than delivered: the batch in hand was cut short", n)
	}
	if pending := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`); pending+delivered != 100 || delivered == 0 || delivered%20 != 0 {
		t.Errorf("%d delivered (in whole batches of 20) + %d pending, want 100 with at least one batch", delivered, pending)
	}
	if delivered == 100 {
		t.Errorf("every batch was delivered: the shutdown did not stop the claiming")
	}
	if snk.handled() != delivered || s.Totals().Delivered != int64(delivered) {
		t.Errorf("sink handled %d, server counted %d, database says %d delivered", snk.handled(), s.Totals().Delivered, delivered)
	}
}

// A batch that cannot finish within the shutdown timeout is cut short and
// completed as retryable: still nothing left leased.
func TestShutdownTimeoutCompletesTheBatchAsRetryable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t, time.Hour) // a target that never answers
	enqueue(t, db.Pool, message("stuck-1"), message("stuck-2"))
	_, stop := start(t, environment(db, snk, nil),
		serve.Config{PollInterval: noPoll, ShutdownTimeout: 300 * time.Millisecond})
	<-snk.started
	stopped := time.Now()
	stop()
	if took := time.Since(stopped); took > 20*time.Second {
		t.Errorf("shutdown took %s with a 300ms shutdown timeout", took)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NULL AND attempt_count = 1`); n != 2 {
		t.Errorf("%d of 2 messages back in the queue, unleased, after their cut-short attempt", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'RETRYABLE'`); n != 2 {
		t.Errorf("%d retryable outcomes recorded, want 2", n)
	}
}

func TestReaperRunsAtStart(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t, 0)
	ctx := context.Background()
	// A message a crashed dispatcher left leased, its lease long expired.
	enqueue(t, db.Pool, message("orphan"))
	if _, err := db.Pool.Exec(ctx, `SELECT * FROM outbox.claim_batch(10, 'crashed-worker', 1)`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the one-second lease expires
	// The server claims only namespace payments: a claim takes over an
	// expired lease too, so only a dispatcher that cannot claim the orphan
	// leaves it to the reaper, which sweeps every namespace.
	start(t, environment(db, snk, map[string]string{"OUTBOX_NAMESPACES": "payments"}),
		serve.Config{PollInterval: 200 * time.Millisecond, ReaperInterval: time.Hour})
	const requeued = `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE' AND worker_id LIKE 'reaper:%'`
	for deadline := time.Now().Add(30 * time.Second); count(t, db.Pool, requeued) == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := count(t, db.Pool, requeued); n != 1 {
		t.Errorf("%d ZOMBIE_REQUEUE outcomes by the reaper, want 1", n)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t, 0)
	env := environment(db, snk, map[string]string{"OUTBOX_ROUTES": `{"routes":[]}`})
	if _, _, err := open(context.Background(), env, serve.Config{}); err == nil {
		t.Error("opened a server without routes")
	}
	if _, err := serve.New(serve.Config{WorkerID: "w", ReaperInterval: time.Minute}, nil, nil, nil); err == nil {
		t.Error("New accepted no dispatcher")
	}
}

// A long-lived server bounds each batch's publishing by the batch's lease:
// with a 2 s lease and a target that takes 4 s, a call is cut off before
// the lease runs out and the message retried, so it is never in flight from
// two servers at once and no lease expires under a server that still holds
// it (no ZOMBIE_REQUEUE, no completion refused as lease lost).
func TestServeBoundsPublishingByTheLease(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var (
		mu             sync.Mutex
		inFlight, most int
		calls          int
	)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body: only then does the server watch the connection,
		// and r.Context() end when the caller gives up.
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		inFlight++
		calls++
		most = max(most, inFlight)
		mu.Unlock()
		defer func() { mu.Lock(); inFlight--; mu.Unlock() }()
		select {
		case <-time.After(4 * time.Second):
			w.WriteHeader(http.StatusNoContent)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	env := environment(db, &testSink{Server: slow}, map[string]string{
		"OUTBOX_LEASE":         "2s",
		"OUTBOX_SAFETY_MARGIN": "1s",
		"OUTBOX_ROUTES": fmt.Sprintf(`{"routes":[{"match":{"namespace":"billing","topic":"*"},
			"target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET","timeout":"30s"},
			"retry":{"max_attempts":50,"base_delay":"0s","max_delay":"100ms"}}]}`, slow.URL+"/usage"),
	})
	for _, worker := range []string{"serve-a", "serve-b"} {
		start(t, env, serve.Config{WorkerID: worker, PollInterval: 100 * time.Millisecond, ReaperInterval: 200 * time.Millisecond})
	}
	enqueue(t, db.Pool, message("slow-1"))
	time.Sleep(7 * time.Second)

	mu.Lock()
	gotMost, gotCalls := most, calls
	mu.Unlock()
	if gotCalls < 2 {
		t.Fatalf("%d calls in 7s: the servers did not retry the cut-off call", gotCalls)
	}
	if gotMost > 1 {
		t.Errorf("the message was in flight %d times at once", gotMost)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE'`); n != 0 {
		t.Errorf("%d leases expired under a server still delivering (ZOMBIE_REQUEUE)", n)
	}
	retryable := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'RETRYABLE'`)
	if retryable < gotCalls-2 {
		t.Errorf("%d retryable outcomes recorded for %d calls: completions were refused", retryable, gotCalls)
	}
	t.Logf("in 7 s: %d calls, at most %d in flight at once, %d RETRYABLE outcomes recorded, no ZOMBIE_REQUEUE", gotCalls, gotMost, retryable)
}

// syncBuffer is a bytes.Buffer the server writes to while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// The server writes the dispatch function's metrics in EMF, with its
// wake-ups: a delivery woken by a notification shows as Delivered and
// NotifyWakeups, summed over the intervals.
func TestServerReportsTheFunctionsMetrics(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t, 0)
	out := &syncBuffer{}
	setup, err := dispatchconfig.LoadServe(environment(db, snk, nil), false)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, closeFn, err := serve.Open(ctx, setup, handler.Deps{Stdout: out}, serve.Config{PollInterval: noPoll, MetricsInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	<-s.Listening()
	time.Sleep(200 * time.Millisecond)
	enqueue(t, db.Pool, message("metered"))
	snk.waitFor(t, "metered", notifyBound)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	closeFn()
	sums := map[string]float64{}
	for _, d := range emftest.Parse(t, out.Bytes()) {
		for name, v := range d.Metrics {
			for _, x := range v.Values {
				sums[name] += x
			}
		}
	}
	if sums["Delivered"] != 1 || sums["Claimed"] != 1 || sums["NotifyWakeups"] < 1 {
		t.Errorf("metrics summed over the intervals: %v; want the one delivery and the wake-up that caused it", sums)
	}
	if tot := s.Totals(); float64(tot.Wakeups) != sums["NotifyWakeups"] || float64(tot.Polls) != sums["Polls"] {
		t.Errorf("totals %+v, metrics %v: every wake-up is reported once", tot, sums)
	}
}
