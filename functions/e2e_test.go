// End-to-end tests of the four functions: the real compiled bootstrap
// binaries, run under a test server that implements the Lambda Runtime API,
// invoked with the events in events/, against a real PostgreSQL and
// wire-level targets.
package functions_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/sink"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// sinkSecret is the webhook signing secret shared by the test sink and the
// dispatch function (through SINK_SECRET).
const sinkSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// webhookSink is a plugin endpoint: the reference receiver, verifying every
// signature, in front of a recorder that counts every request per
// webhook-id (duplicates included) and can be told to refuse or slow down.
type webhookSink struct {
	*httptest.Server
	mu       sync.Mutex
	requests map[string]int
	handled  map[string]publish.Envelope
	delay    time.Duration
	started  chan struct{}
	once     sync.Once
	// traceHeaders are the X-Amzn-Trace-Id headers received, per webhook-id.
	traceHeaders map[string]string
}

func newSink(t *testing.T) *webhookSink {
	t.Helper()
	secret, err := parseSecret(sinkSecret)
	if err != nil {
		t.Fatal(err)
	}
	s := &webhookSink{requests: map[string]int{}, handled: map[string]publish.Envelope{}, started: make(chan struct{}), traceHeaders: map[string]string{}}
	receiver := sink.NewReceiver(secret, sink.NewMemoryDeduper(), func(ctx context.Context, env publish.Envelope) error {
		if strings.Contains(string(env.Payload), `"poison"`) {
			return sink.Reject(http.StatusUnprocessableEntity, fmt.Errorf("unknown tenant in %s", env.ID))
		}
		s.mu.Lock()
		s.handled[env.Key] = env
		s.mu.Unlock()
		return nil
	})
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.once.Do(func() { close(s.started) })
		s.mu.Lock()
		s.requests[r.Header.Get("webhook-id")]++
		s.traceHeaders[r.Header.Get("webhook-id")] = r.Header.Get("X-Amzn-Trace-Id")
		delay := s.delay
		s.mu.Unlock()
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
		}
		receiver.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *webhookSink) setDelay(d time.Duration) {
	s.mu.Lock()
	s.delay = d
	s.mu.Unlock()
}

// counts returns how many distinct keys were handled and how many requests
// the most-delivered key received.
func (s *webhookSink) counts() (handled, maxRequests int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.requests {
		maxRequests = max(maxRequests, n)
	}
	return len(s.handled), maxRequests
}

func (s *webhookSink) routes() string {
	return fmt.Sprintf(`{"routes":[
	  {"match":{"namespace":"billing","topic":"*"},
	   "target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET","timeout":"5s"},
	   "retry":{"max_attempts":5,"base_delay":"1s","max_delay":"10s"}}]}`, s.URL+"/usage")
}

// env is a function's environment against db.
func env(db *pgtest.DB, extra ...string) []string {
	return append([]string{
		"OUTBOX_DATABASE_URL=" + db.URL,
		"OUTBOX_TRACING=off",
		"OUTBOX_FUNCTION_TIMEOUT=60s",
		"SINK_SECRET=" + sinkSecret,
	}, extra...)
}

func start(t *testing.T, name string, envs ...string) *lambdatest.Function {
	t.Helper()
	return lambdatest.Start(t, lambdatest.Build(t, name), name, envs...)
}

func event(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "events", file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func invoke(t *testing.T, f *lambdatest.Function, payload []byte, budget time.Duration, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget+30*time.Second)
	defer cancel()
	if err := f.InvokeJSON(ctx, payload, budget, out); err != nil {
		t.Fatalf("invoke: %v\nstdout:\n%s\nstderr:\n%s", err, f.Stdout(), f.Stderr())
	}
}

func enqueue(t *testing.T, pool *pgxpool.Pool, n int, build func(i int) outbox.Message) {
	t.Helper()
	for from := 0; from < n; from += 1000 {
		var batch []outbox.Message
		for i := from; i < min(n, from+1000); i++ {
			batch = append(batch, build(i))
		}
		if _, err := outbox.EnqueueBatch(context.Background(), pool, batch); err != nil {
			t.Fatal(err)
		}
	}
}

func usage(i int) outbox.Message {
	return outbox.Message{
		Namespace: "billing", Topic: "usage_snapshot", TenantID: fmt.Sprintf("tenant-%d", i%7),
		DedupeKey: fmt.Sprintf("tenant-%d/turn-%d/req-1", i%7, i),
		Payload:   json.RawMessage(fmt.Sprintf(`{"turn":%d,"tokens":%d}`, i, 100+i)),
	}
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// emfValues sums every value of each metric (by name and TargetType) in
// the function's EMF documents.
func emfValues(t *testing.T, stdout string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), `"_aws"`) {
			continue
		}
		var doc map[string]any
		if err := json.Unmarshal(line, &doc); err != nil {
			t.Fatalf("an EMF line is not JSON: %s", line)
		}
		aws := doc["_aws"].(map[string]any)
		for _, d := range aws["CloudWatchMetrics"].([]any) {
			for _, m := range d.(map[string]any)["Metrics"].([]any) {
				name := m.(map[string]any)["Name"].(string)
				key := name
				if tt, ok := doc["TargetType"].(string); ok {
					key = name + "/" + tt
				}
				switch v := doc[name].(type) {
				case float64:
					out[key] += v
				case []any:
					for _, x := range v {
						out[key] += x.(float64)
					}
				}
			}
		}
	}
	return out
}

func TestDispatchDeliversAndDeadLetters(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	enqueue(t, db.Pool, 300, func(i int) outbox.Message {
		m := usage(i)
		switch {
		case i%60 == 0:
			m.Payload = json.RawMessage(fmt.Sprintf(`{"turn":%d,"poison":true}`, i)) // the plugin refuses it
		case i%100 == 1:
			m.Namespace = "unrouted" // no route
		}
		return m
	})
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+snk.routes(), "OUTBOX_BATCH_SIZE=100")...)

	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.StoppedBy != "drained" || sum.Claimed != 300 || sum.Delivered != 292 || sum.Dead != 5 || sum.Retried != 3 || sum.LeaseLost != 0 {
		t.Fatalf("summary %+v, want 292 delivered, 5 poison dead and 3 unrouted held, drained", sum)
	}
	if !strings.HasPrefix(sum.WorkerID, "dispatch:req-dispatch-") {
		t.Errorf("worker id %q does not name the invocation", sum.WorkerID)
	}
	handled, maxRequests := snk.counts()
	if handled != 292 || maxRequests != 1 {
		t.Fatalf("sink handled %d messages, at most %d requests per message; want 292 exactly once", handled, maxRequests)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE last_error_code = 'NO_ROUTE' AND next_attempt_at > now()`); n != 3 {
		t.Fatalf("%d unrouted messages held (pending, NO_ROUTE, waiting to retry), want 3", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead WHERE last_error_code = 'TARGET_REJECTED' AND last_error LIKE '%422%'`); n != 5 {
		t.Fatalf("%d poison messages dead as TARGET_REJECTED, want 5", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead WHERE last_error_code = 'NO_ROUTE'`); n != 0 {
		t.Fatalf("%d unrouted messages dead as NO_ROUTE: a missing route must hold them, not kill them", n)
	}

	// The invocation's metrics equal its answer.
	got := emfValues(t, awaitOutput(t, fn, `"dispatch finished"`, 1))
	for name, want := range map[string]int{"Claimed": sum.Claimed, "Delivered": sum.Delivered, "Retried": sum.Retried, "DeadLettered": sum.Dead, "LeaseLost": sum.LeaseLost, "Delivered/http": 292} {
		if got[name] != float64(want) {
			t.Errorf("EMF %s = %v, summary says %d", name, got[name], want)
		}
	}
	if got["ColdStart"] != 1 {
		t.Errorf("ColdStart = %v on the first invocation", got["ColdStart"])
	}

	// A second tick finds nothing new (at most the held messages again, if
	// their backoff ran out): drained, and no longer a cold start.
	invoke(t, fn, event(t, "dispatch-scheduled-rule.json"), 30*time.Second, &sum)
	if sum.StoppedBy != "drained" || sum.Delivered+sum.Dead != 0 || sum.Claimed != sum.Held {
		t.Fatalf("second tick %+v", sum)
	}
	if got := emfValues(t, awaitOutput(t, fn, `"dispatch finished"`, 2)); got["ColdStart"] != 1 {
		t.Errorf("ColdStart summed %v over two invocations, want 1", got["ColdStart"])
	}
}

func TestMalformedEventsChangeNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	enqueue(t, db.Pool, 20, usage)
	// Some dead letters, so that a wrongly accepted replay would have
	// something to move.
	if _, err := db.Pool.Exec(context.Background(), `UPDATE outbox.pending SET next_attempt_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	fns := map[string]*lambdatest.Function{
		"dispatch":   start(t, "dispatch", env(db, "OUTBOX_ROUTES="+snk.routes())...),
		"dlq-replay": start(t, "dlq-replay", env(db)...),
		"reaper":     start(t, "reaper", env(db)...),
		"metrics":    start(t, "metrics", env(db)...),
	}
	cases := []struct {
		function string
		payload  []byte
		want     string
	}{
		{"dispatch", event(t, "dispatch-malformed.json"), `field "batch_size" must be int`},
		{"dispatch", []byte(`{"batch_size": 0, "namespaces": ["bad name"]}`), `"bad name" is not a namespace`},
		{"dispatch", []byte(`[1,2,3]`), "must be a JSON object"},
		{"dlq-replay", event(t, "dlq-replay-malformed.json"), `unknown field "limt"`},
		{"dlq-replay", event(t, "dlq-replay-empty-filter.json"), "no filter given"},
		{"dlq-replay", []byte(`{"message_ids":["not-a-uuid"],"dry_run":false,"reason":"x"}`), `"not-a-uuid" is not a message id`},
		{"dlq-replay", []byte(`{"namespace":"billing","dry_run":false}`), "needs a reason"},
		{"dlq-replay", []byte(`{"namespace":"billing","limit":1000000}`), "limit must be between 1 and 1000"},
		{"reaper", []byte(`{"max_rounds":"many"}`), `field "max_rounds" must be int`},
		{"metrics", []byte(`{"top":5}`), `unknown field "top"`},
	}
	for _, tc := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := fns[tc.function].Invoke(ctx, tc.payload, 10*time.Second)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if r.Err == nil || r.Err.Type != "EventError" || !strings.Contains(r.Err.Message, tc.want) {
			t.Errorf("%s %s: answer %s, error %v; want an EventError mentioning %q", tc.function, tc.payload, r.Body, r.Err, tc.want)
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts`); n != 0 {
		t.Errorf("malformed events wrote %d attempts", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NULL AND attempt_count = 0`); n != 20 {
		t.Errorf("malformed events disturbed the queue: %d of 20 untouched", n)
	}
	if handled, _ := snk.counts(); handled != 0 {
		t.Errorf("malformed events delivered %d messages", handled)
	}
}

func TestDispatchStopsBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	snk.setDelay(300 * time.Millisecond)
	enqueue(t, db.Pool, 5000, usage)
	// A batch of 20 is 3 rounds of the webhook's 8 requests in flight,
	// about 0.9 s: within the 4 s safety margin, as the margin must cover
	// one batch's publishing and its completion, so that no request is cut
	// off by the deadline. The margin leaves a machine busy with other work
	// seconds for the completion (at 1.5 s, a loaded run timed out in it).
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+snk.routes(), "OUTBOX_BATCH_SIZE=20",
		"OUTBOX_MAX_BATCHES=1000", "OUTBOX_SAFETY_MARGIN=4s", "OUTBOX_FUNCTION_TIMEOUT=15s")...)
	if _, err := fn.ColdStart(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	const budget = 7 * time.Second
	deadline := time.Now().Add(budget)
	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), budget, &sum)
	if time.Now().After(deadline) {
		t.Fatalf("answered %s after the deadline", time.Since(deadline))
	}
	if sum.StoppedBy != "deadline" {
		t.Fatalf("stopped by %q, want deadline: %+v", sum.StoppedBy, sum)
	}
	if sum.Claimed == 0 || sum.Claimed >= 5000 {
		t.Fatalf("claimed %d of a 5000 backlog", sum.Claimed)
	}
	// Every claimed message was completed exactly once: none left leased,
	// one attempt each, and what the sink handled is what the summary says.
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NOT NULL`); n != 0 {
		t.Errorf("%d messages left leased", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts`); n != sum.Claimed {
		t.Errorf("%d attempts recorded for %d claimed messages", n, sum.Claimed)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`) + count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != 5000 {
		t.Errorf("pending + dispatched = %d, want 5000: a message was lost", n)
	}
	// On an idle machine the sink handled exactly what was delivered. A
	// machine busy enough to slow a batch past its estimate may see a call
	// cut off by the completion reserve after the sink took it: that
	// message must then be recorded as a retry (a harmless duplicate to
	// come), never lost and never counted delivered without its answer.
	handled, maxRequests := snk.counts()
	cut := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'RETRYABLE' AND error_code IN ('CANCELED', 'TIMEOUT')`)
	if handled < sum.Delivered || handled > sum.Delivered+cut || maxRequests > 1 {
		t.Errorf("sink handled %d (max %d requests each), summary delivered %d, %d calls cut off", handled, maxRequests, sum.Delivered, cut)
	}
	if cut > 0 {
		t.Logf("%d calls cut off by the deadline on a busy machine", cut)
	}
}

func TestCrashedDispatchIsRepairedByTheReaper(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	snk.setDelay(2 * time.Second)
	enqueue(t, db.Pool, 400, usage)
	envs := env(db, "OUTBOX_ROUTES="+snk.routes(), "OUTBOX_BATCH_SIZE=200")
	crashing := start(t, "dispatch", envs...)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		crashing.Invoke(ctx, event(t, "dispatch-schedule.json"), 50*time.Second)
	}()
	select {
	case <-snk.started:
	case <-time.After(30 * time.Second):
		t.Fatalf("the dispatch never reached the sink\n%s", crashing.Stdout())
	}
	crashing.Kill() // mid-batch: messages claimed, some requests in flight, nothing completed
	// The batch in hand, and the next one if the pipeline had claimed it.
	leased := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NOT NULL`)
	if leased != 200 && leased != 400 {
		t.Fatalf("%d leased rows after the crash, want the batch of 200 in hand (and the one claimed ahead)", leased)
	}
	snk.setDelay(0)

	// Until the lease expires, nobody takes them.
	reaper := start(t, "reaper", env(db)...)
	var reaped struct {
		Requeued       int `json:"requeued"`
		PurgedAttempts int `json:"purged_attempts"`
		PurgedDedupe   int `json:"purged_dedupe"`
	}
	invoke(t, reaper, event(t, "reaper-schedule.json"), 10*time.Second, &reaped)
	if reaped.Requeued != 0 {
		t.Fatalf("the reaper requeued %d live leases", reaped.Requeued)
	}
	// The lease runs out (moved into the past rather than waited for).
	if _, err := db.Pool.Exec(context.Background(), `UPDATE outbox.pending SET lease_expires_at = now() - interval '1 second' WHERE lease_token IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	invoke(t, reaper, event(t, "reaper-schedule.json"), 10*time.Second, &reaped)
	if reaped.Requeued != leased {
		t.Fatalf("reaper requeued %d, want the %d leased", reaped.Requeued, leased)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE'`); n != leased {
		t.Fatalf("%d ZOMBIE_REQUEUE attempts, want %d", n, leased)
	}

	var sum dispatch.Summary
	invoke(t, start(t, "dispatch", envs...), event(t, "dispatch-schedule.json"), 50*time.Second, &sum)
	if sum.Delivered != 400 || sum.StoppedBy != "drained" {
		t.Fatalf("dispatch after repair: %+v, want all 400 delivered", sum)
	}
	if handled, _ := snk.counts(); handled != 400 {
		t.Fatalf("sink handled %d distinct messages, want 400: a message was lost", handled)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`); n != 0 {
		t.Fatalf("%d left pending", n)
	}
}

func TestConcurrentDispatchersDeliverEachMessageOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	const total = 20_000
	enqueue(t, db.Pool, total, usage)
	envs := env(db, "OUTBOX_ROUTES="+snk.routes(), "OUTBOX_BATCH_SIZE=500", "OUTBOX_MAX_BATCHES=100", "OUTBOX_FUNCTION_TIMEOUT=5m")
	var fns []*lambdatest.Function
	for range 4 {
		fn := start(t, "dispatch", envs...)
		if _, err := fn.ColdStart(time.Minute); err != nil {
			t.Fatal(err)
		}
		fns = append(fns, fn)
	}
	sums := make([]dispatch.Summary, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			invoke(t, fn, event(t, "dispatch-schedule.json"), 4*time.Minute, &sums[i])
		}()
	}
	wg.Wait()
	delivered := 0
	for _, s := range sums {
		delivered += s.Delivered
		if s.LeaseLost != 0 || s.Dead != 0 || s.Retried != 0 {
			t.Errorf("summary %+v", s)
		}
	}
	if delivered != total {
		t.Fatalf("delivered %d in all, want %d", delivered, total)
	}
	handled, maxRequests := snk.counts()
	if handled != total || maxRequests != 1 {
		t.Fatalf("sink handled %d, at most %d requests per message; want %d exactly once", handled, maxRequests, total)
	}
	// The claims must really have interleaved for the test to prove
	// anything; a dispatcher that cold-starts late may find nothing left.
	if n := count(t, db.Pool, `SELECT count(DISTINCT worker_id) FROM outbox.attempts`); n < 2 {
		t.Errorf("only %d dispatcher did the work: the run did not exercise concurrency", n)
	}
}

func TestReplayDryRunThenMove(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	enqueue(t, db.Pool, 30, func(i int) outbox.Message {
		m := usage(i)
		if i%3 == 0 {
			m.Payload = json.RawMessage(fmt.Sprintf(`{"turn":%d,"poison":true}`, i))
		}
		return m
	})
	var sum dispatch.Summary
	invoke(t, start(t, "dispatch", env(db, "OUTBOX_ROUTES="+snk.routes())...), event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.Dead != 10 {
		t.Fatalf("setup: %+v, want 10 dead", sum)
	}
	replay := start(t, "dlq-replay", env(db)...)
	type answer struct {
		Matched    int      `json:"matched"`
		Replayed   int      `json:"replayed"`
		DryRun     bool     `json:"dry_run"`
		MessageIDs []string `json:"message_ids"`
	}
	var dry answer
	invoke(t, replay, []byte(`{"namespace":"billing","error_code":"TARGET_REJECTED"}`), 10*time.Second, &dry)
	if !dry.DryRun || dry.Matched != 10 || dry.Replayed != 0 || len(dry.MessageIDs) != 10 {
		t.Fatalf("dry run %+v", dry)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead`); n != 10 {
		t.Fatalf("the dry run moved messages: %d dead left", n)
	}
	// Move exactly three, chosen by id.
	ev, _ := json.Marshal(map[string]any{"message_ids": dry.MessageIDs[:3], "dry_run": false, "reason": "tenant added (INC-7)", "operator": "alice"})
	var moved answer
	invoke(t, replay, ev, 10*time.Second, &moved)
	if moved.DryRun || moved.Replayed != 3 || fmt.Sprint(moved.MessageIDs) != fmt.Sprint(dry.MessageIDs[:3]) {
		t.Fatalf("replay %+v, want exactly %v moved", moved, dry.MessageIDs[:3])
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE id::text = ANY($1) AND attempt_count = 0 AND next_attempt_at <= now()`, dry.MessageIDs[:3]); n != 3 {
		t.Fatalf("%d of the 3 replayed messages are due in pending", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'REPLAYED' AND operator = 'alice' AND reason = 'tenant added (INC-7)'`); n != 3 {
		t.Fatalf("%d audited REPLAYED attempts, want 3", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead`); n != 7 {
		t.Fatalf("%d dead left, want 7", n)
	}
	r, err := replay.Invoke(context.Background(), event(t, "dlq-replay-empty-filter.json"), 10*time.Second)
	if err != nil || r.Err == nil || !strings.Contains(r.Err.Message, "no filter given") {
		t.Fatalf("empty filter: %v %v", r.Err, err)
	}
	var all answer
	invoke(t, replay, event(t, "dlq-replay-all.json"), 10*time.Second, &all)
	if !all.DryRun || all.Matched != 7 {
		t.Fatalf(`{"all": true} dry run %+v, want the 7 left`, all)
	}
}

func TestColdStartRejectsBadConfiguration(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	good := `{"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"http","url":"http://127.0.0.1:9/x","signing_secret_env":"SINK_SECRET"}}]}`
	cases := []struct {
		name     string
		function string
		env      []string
		want     []string
	}{
		{"no database", "dispatch", []string{"OUTBOX_ROUTES=" + good, "OUTBOX_TRACING=off", "SINK_SECRET=" + sinkSecret},
			[]string{"no database configured", "OUTBOX_DATABASE_URL", "OUTBOX_DB_SECRET_ARN", "OUTBOX_DB_IAM_AUTH"}},
		{"lease inside the safety margin", "dispatch", env(db, "OUTBOX_ROUTES="+good, "OUTBOX_LEASE=5s", "OUTBOX_SAFETY_MARGIN=10s"),
			[]string{"OUTBOX_LEASE (5s) must be longer than OUTBOX_SAFETY_MARGIN (10s)"}},
		{"fan-out without a timeout", "dispatch", env(db, "OUTBOX_ROUTES="+good, "OUTBOX_MAX_WORKERS=4", "OUTBOX_FUNCTION_TIMEOUT="),
			[]string{"OUTBOX_MAX_WORKERS is 4 but OUTBOX_FUNCTION_TIMEOUT is unset"}},
		{"linger neither on nor off", "dispatch", env(db, "OUTBOX_ROUTES="+good, "OUTBOX_LINGER=sometimes"),
			[]string{`OUTBOX_LINGER must be on or off, got "sometimes"`}},
		{"malformed routes", "dispatch", env(db, `OUTBOX_ROUTES={"routes":[{"match":{"namespace":"a"},"target":{"type":"carrier-pigeon"}}]}`),
			[]string{"routes[0].match.topic", "routes[0].target.type", "carrier-pigeon"}},
		{"inline secret", "dispatch", env(db, `OUTBOX_ROUTES={"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"http","url":"https://x.example/","signing_secret":"whsec_abc"}}]}`),
			[]string{"routes[0].target.signing_secret", "signing_secret_env or signing_secret_arn"}},
		{"unknown format, and cloudevents with offload", "dispatch", env(db, `OUTBOX_ROUTES={"routes":[{"match":{"namespace":"a","topic":"*"},"format":"cloudevent","target":{"type":"lambda","function":"f"}},`+
			`{"match":{"namespace":"b","topic":"*"},"format":"cloudevents","offload":{"bucket":"b-1"},"target":{"type":"sns","topic_arn":"arn:aws:sns:us-east-1:123456789012:t"}}]}`),
			[]string{`routes[0].format: must be "cloudevents"`, "routes[1].format: cloudevents cannot be combined with offload"}},
		{"missing signing secret", "dispatch", env(db, "OUTBOX_ROUTES="+strings.Replace(good, "SINK_SECRET", "NOT_SET_ANYWHERE", 1)),
			[]string{"NOT_SET_ANYWHERE"}},
		{"bad batch size and margin", "dispatch", env(db, "OUTBOX_ROUTES="+good, "OUTBOX_BATCH_SIZE=0", "OUTBOX_SAFETY_MARGIN=soon"),
			[]string{"OUTBOX_BATCH_SIZE must be between 1 and 10000", "OUTBOX_SAFETY_MARGIN must be a Go duration"}},
		{"bad retention", "reaper", env(db, "OUTBOX_ATTEMPTS_RETENTION=5m"),
			[]string{"OUTBOX_ATTEMPTS_RETENTION must be 0 (keep) or at least 1h"}},
		{"bad top n", "metrics", env(db, "OUTBOX_METRICS_TOP_N=1000"), []string{"OUTBOX_METRICS_TOP_N must be between 1 and 100"}},
		{"bad log level", "dlq-replay", env(db, "OUTBOX_LOG_LEVEL=chatty"), []string{"OUTBOX_LOG_LEVEL"}},
		{"unreachable database", "reaper", []string{"OUTBOX_DATABASE_URL=postgres://outbox:hunter2@127.0.0.1:1/outbox?connect_timeout=2", "OUTBOX_TRACING=off"},
			[]string{"127.0.0.1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fn := start(t, tc.function, tc.env...)
			_, err := fn.ColdStart(30 * time.Second)
			fe, ok := err.(*lambdatest.FunctionError)
			if !ok || !fe.Init || fe.Type != "ConfigError" {
				t.Fatalf("cold start: %v, want an init ConfigError", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(fe.Message, w) {
					t.Errorf("init error %q does not mention %q", fe.Message, w)
				}
			}
			if strings.Contains(fe.Message, "hunter2") || strings.Contains(fn.Stdout(), "hunter2") {
				t.Errorf("the password leaked: %s", fe.Message)
			}
		})
	}
}

// parseSecret decodes a Standard Webhooks secret for the sink.
func parseSecret(s string) ([]byte, error) { return webhook.ParseSecret(s) }

// The reaper keeps the archive's days made ahead on every run, even with
// every retention off (no purge pass): a day it did not make would collect
// its attempts in the DEFAULT partition.
func TestTheReaperMakesTheArchivesDaysAhead(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	days := `SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox.attempts'::regclass
		AND inhrelid::regclass::text = ANY (ARRAY(SELECT 'outbox.attempts_p' || to_char(d, 'YYYYMMDD')
		FROM generate_series((now() AT TIME ZONE 'UTC')::date, (now() AT TIME ZONE 'UTC')::date + 3, interval '1 day') d))`
	var stmt string
	if err := db.Pool.QueryRow(ctx, `SELECT format('DROP TABLE IF EXISTS outbox.attempts_p%s, outbox.attempts_p%s',
		to_char((now() AT TIME ZONE 'UTC')::date + 2, 'YYYYMMDD'), to_char((now() AT TIME ZONE 'UTC')::date + 3, 'YYYYMMDD'))`).Scan(&stmt); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, stmt); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db.Pool, days); n > 2 {
		t.Fatalf("%d of today's and the next 3 days' partitions before the reaper, want at most 2", n)
	}
	reaper := start(t, "reaper", env(db, "OUTBOX_ATTEMPTS_RETENTION=0", "OUTBOX_DEDUPE_RETENTION=0", "OUTBOX_KEY_RETENTION=0")...)
	var reaped struct {
		PurgedAttempts int `json:"purged_attempts"`
	}
	invoke(t, reaper, event(t, "reaper-schedule.json"), 10*time.Second, &reaped)
	if n := count(t, db.Pool, days); n != 4 {
		t.Fatalf("%d of today's and the next 3 days' partitions after the reaper, want 4", n)
	}
}
