package functions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/gate"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/testkit/emftest"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// gateReceiver is a webhook that can be down (503), and that records each
// call and each delivery with its time.
type gateReceiver struct {
	*httptest.Server
	down      atomic.Bool
	mu        sync.Mutex
	calls     []time.Time
	delivered []time.Time
	lastSeq   map[string]int64
	outOfSeq  []string
}

func newGateReceiver(t *testing.T) *gateReceiver {
	r := &gateReceiver{lastSeq: map[string]int64{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var env publish.Envelope
		if err := json.Unmarshal(body, &env); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		now := time.Now()
		r.mu.Lock()
		defer r.mu.Unlock()
		r.calls = append(r.calls, now)
		if r.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if env.OrderingKey != "" {
			// A retry of the last delivered message is harmless; an
			// earlier one after a later one is not.
			if last := r.lastSeq[env.OrderingKey]; env.SequenceID < last {
				r.outOfSeq = append(r.outOfSeq, fmt.Sprintf("%s#%d after #%d", env.OrderingKey, env.SequenceID, last))
			}
			r.lastSeq[env.OrderingKey] = env.SequenceID
		}
		r.delivered = append(r.delivered, now)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *gateReceiver) counts() (calls, delivered int, outOfSeq []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls), len(r.delivered), append([]string(nil), r.outOfSeq...)
}

func (r *gateReceiver) routes(extra string) string {
	return fmt.Sprintf(`{"routes":[{"match":{"namespace":"*","topic":"*"},
		"target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET","timeout":"5s","concurrency":8},
		"retry":{"max_attempts":5,"base_delay":"0s","max_delay":"1s"}%s}]}`, r.URL+"/hook", extra)
}

// startDispatchers cold-starts n dispatch functions.
func startDispatchers(t *testing.T, n int, envs []string) []*lambdatest.Function {
	t.Helper()
	var fns []*lambdatest.Function
	for range n {
		fn := start(t, "dispatch", envs...)
		if _, err := fn.ColdStart(time.Minute); err != nil {
			t.Fatal(err)
		}
		fns = append(fns, fn)
	}
	return fns
}

// invokeAll invokes every function at once, each in a loop until until()
// says stop; it answers the sum of their summaries.
func invokeAll(t *testing.T, fns []*lambdatest.Function, until func() bool) dispatch.Summary {
	t.Helper()
	sums := make([]dispatch.Summary, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() {
			for !until() {
				var s dispatch.Summary
				invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &s)
				sums[i].Add(s)
				if s.Claimed == 0 {
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	var total dispatch.Summary
	for _, s := range sums {
		total.Add(s)
	}
	return total
}

// A target that answers 503 under three concurrent dispatchers: the
// breaker opens after its failures, nothing is dead-lettered, the target
// is called at most once per cool-down while open (the probe, won by one
// dispatcher), and when the target is back one probe closes the breaker
// and everything is delivered, in order per key, in at most 2 attempts.
func TestCircuitBreakerHoldsADownTargetAcrossInvocations(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rcv := newGateReceiver(t)
	rcv.down.Store(true)
	const coolDown = 2 * time.Second
	for _, key := range []string{"acct-1", "acct-2", "acct-3", "acct-4"} {
		enqueue(t, db.Pool, 15, paymentsOf(key))
	}
	enqueue(t, db.Pool, 20, usage)
	const total = 80
	fns := startDispatchers(t, 3, env(db, "OUTBOX_ROUTES="+rcv.routes(`,"circuit_breaker":{"failures":3,"cool_down":"2s"}`),
		"OUTBOX_BATCH_SIZE=20"))

	// The outage: the dispatchers run until the breaker is open.
	open := func() bool { return count(t, db.Pool, `SELECT count(*) FROM outbox.open_breakers()`) == 1 }
	invokeAll(t, fns, open)
	openedCalls, _, _ := rcv.counts()
	// While open, for three cool-downs: at most one call per cool-down.
	openedAt := time.Now()
	sum := invokeAll(t, fns, func() bool { return time.Since(openedAt) > 3*coolDown })
	calls, _, _ := rcv.counts()
	if probes := calls - openedCalls; probes > int(time.Since(openedAt)/coolDown)+1 {
		t.Errorf("%d calls in %s while the breaker was open; want at most one probe per %s", probes, time.Since(openedAt), coolDown)
	}
	if sum.Dead != 0 || count(t, db.Pool, `SELECT count(*) FROM outbox.dead`) != 0 {
		t.Fatalf("dead letters during the outage: %+v", sum)
	}
	if sum.Released == 0 {
		t.Errorf("no message was held while the breaker was open: %+v", sum)
	}

	// The target is back: the next probe closes the breaker and the rest
	// is delivered.
	rcv.down.Store(false)
	sum = invokeAll(t, fns, func() bool { return count(t, db.Pool, `SELECT count(*) FROM outbox.pending`) == 0 })
	_, delivered, outOfSeq := rcv.counts()
	if delivered != total || len(outOfSeq) > 0 {
		t.Fatalf("delivered %d of %d; out of sequence: %v", delivered, total, outOfSeq)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead`); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
	if n := count(t, db.Pool, `SELECT coalesce(max(attempt_no), 0) FROM outbox.attempts`); n > 2 {
		t.Errorf("a message took %d attempts, want at most 2", n)
	}
	if open() {
		t.Error("the breaker is still open after the target came back")
	}
}

// A rate limit of 20 a second, offered far more by 4 concurrent
// dispatchers: the target never gets more than the bucket's tokens (one
// second's worth, plus 20 a second since the first claim), ordered keys
// stay in order, and every message is delivered once.
func TestRateLimitHoldsAcrossInvocations(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rcv := newGateReceiver(t)
	const rate = 20
	for _, key := range []string{"acct-1", "acct-2"} {
		enqueue(t, db.Pool, 20, paymentsOf(key))
	}
	enqueue(t, db.Pool, 80, func(i int) outbox.Message { return usage(i) })
	const total = 120
	fns := startDispatchers(t, 4, env(db, "OUTBOX_ROUTES="+rcv.routes(fmt.Sprintf(`,"rate_limit":{"per_second":%d}`, rate)),
		"OUTBOX_BATCH_SIZE=50"))
	start := time.Now()
	sum := invokeAll(t, fns, func() bool { return count(t, db.Pool, `SELECT count(*) FROM outbox.pending`) == 0 })
	elapsed := time.Since(start)
	calls, delivered, outOfSeq := rcv.counts()
	if delivered != total || calls != total || len(outOfSeq) > 0 {
		t.Fatalf("%d calls, %d delivered of %d; out of sequence: %v", calls, delivered, total, outOfSeq)
	}
	if tokens := rate + int(elapsed.Seconds()*rate); delivered > tokens {
		t.Fatalf("%d delivered in %s: more than the %d tokens of a %d/s bucket", delivered, elapsed, tokens, rate)
	}
	if sum.Released == 0 || sum.Dead != 0 {
		t.Errorf("%+v: want messages held by the limit, none dead", sum)
	}
	if n := count(t, db.Pool, `SELECT coalesce(max(attempt_no), 0) FROM outbox.attempts`); n != 1 {
		t.Errorf("a message took %d attempts; being held must not spend one", n)
	}
}

// The metrics function reports open circuit breakers: CircuitsOpen in
// all (the alarm's metric) and CircuitOpen per target, and logs why.
func TestMetricsReportOpenCircuitBreakers(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const target = "http:https://hooks.example/pay"
	if _, err := gate.NewStore(db.Pool).Record(context.Background(), "w", []gate.Outcome{{Target: target,
		Failures: 5, Threshold: 5, CoolDown: time.Minute, LastError: "TARGET_5XX: 503"}}); err != nil {
		t.Fatal(err)
	}
	fn := start(t, "metrics", env(db)...)
	var snap json.RawMessage
	invoke(t, fn, event(t, "metrics-schedule.json"), 20*time.Second, &snap)
	out := awaitOutput(t, fn, `"queue snapshot"`, 1)
	var emfLines []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, `"_aws"`) {
			emfLines = append(emfLines, line)
		}
	}
	var open, perTarget float64 = -1, -1
	for _, d := range emftest.Parse(t, []byte(strings.Join(emfLines, "\n")+"\n")) {
		if mv, ok := d.Metrics["CircuitsOpen"]; ok {
			open = mv.Values[0]
		}
		if mv, ok := d.Metrics["CircuitOpen"]; ok && d.Dimensions["Target"] == target {
			perTarget = mv.Values[0]
		}
	}
	if open != 1 || perTarget != 1 {
		t.Errorf("EMF CircuitsOpen %v, CircuitOpen{Target=%s} %v; want 1 and 1", open, target, perTarget)
	}
	if !strings.Contains(out, `"last_error":"TARGET_5XX: 503"`) {
		t.Errorf("the metrics log does not say why the breaker is open:\n%s", out)
	}
}
