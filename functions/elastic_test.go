package functions_test

// Elastic dispatch, end to end: the real dispatch bootstrap under the
// Lambda emulation (shared/testkit/lambdaemu), which starts environments,
// enforces reserved concurrency and deadlines, queues asynchronous
// invocations and kills processes as Lambda would. The function invokes
// itself through the emulator's Invoke API with its own SDK client.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/fanout"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/deploybench"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/testkit/workload"
)

const elasticFunction = "outbox-dispatch"

// emulated registers the dispatch bootstrap under a new emulator with the
// given settings and environment (after the database, the routes to
// target, and tracing off).
func emulated(t *testing.T, db *pgtest.DB, target *workload.Target, routeConcurrency int, fc lambdaemu.FunctionConfig, env ...string) *lambdaemu.Emulator {
	t.Helper()
	e, err := lambdaemu.New(lambdaemu.Options{DiscardLogs: false})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	routes := fmt.Sprintf(`{"routes":[{"match":{"namespace":"*","topic":"*"},
	  "target":{"type":"http","url":%q,"signing_secret_env":"TARGET_SIGNING_SECRET","concurrency":%d}}]}`, target.URL, routeConcurrency)
	fc.Name, fc.Binary = elasticFunction, lambdatest.Build(t, "dispatch")
	fc.Env = append([]string{
		"OUTBOX_DATABASE_URL=" + db.URL, "OUTBOX_ROUTES=" + routes, "TARGET_SIGNING_SECRET=" + target.Secret,
		"OUTBOX_TRACING=off", fmt.Sprintf("OUTBOX_FUNCTION_TIMEOUT=%ds", int(fc.Timeout.Seconds())),
	}, env...)
	if err := e.Register(fc); err != nil {
		t.Fatal(err)
	}
	return e
}

func startTarget(t *testing.T, latency time.Duration) *workload.Target {
	t.Helper()
	target, err := workload.StartTarget(latency)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	return target
}

func backlog(t *testing.T, db *pgtest.DB, n int) {
	t.Helper()
	if err := workload.CommitBacklog(t.Context(), db.Pool, workload.NewLedger(), n); err != nil {
		t.Fatal(err)
	}
}

// answers decodes every dispatch invocation's answer, failing the test on
// an invocation that did not succeed.
func answers(t *testing.T, e *lambdaemu.Emulator) []dispatchfn.Answer {
	t.Helper()
	invs, err := e.Invocations(elasticFunction)
	if err != nil {
		t.Fatal(err)
	}
	var out []dispatchfn.Answer
	for _, inv := range invs {
		var a dispatchfn.Answer
		if inv.Outcome != lambdaemu.OutcomeSucceeded || json.Unmarshal(inv.Response, &a) != nil {
			logs, _ := e.Logs(elasticFunction)
			t.Fatalf("invocation %s (%s): %s %s\n%s", inv.RequestID, inv.Payload, inv.Outcome, inv.Response, tail(logs, 30))
		}
		out = append(out, a)
	}
	return out
}

func tail(logs []lambdaemu.LogLine, n int) string {
	var b strings.Builder
	for _, l := range logs[max(0, len(logs)-n):] {
		b.WriteString(l.Text + "\n")
	}
	return b.String()
}

func waitIdle(t *testing.T, e *lambdaemu.Emulator, bound time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	if err := e.WaitIdle(ctx, elasticFunction); err != nil {
		t.Fatal(err)
	}
}

func invokeEmulated(t *testing.T, e *lambdaemu.Emulator, payload string) dispatchfn.Answer {
	t.Helper()
	inv, err := e.Invoke(elasticFunction, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	var a dispatchfn.Answer
	if inv.Outcome != lambdaemu.OutcomeSucceeded || json.Unmarshal(inv.Response, &a) != nil {
		logs, _ := e.Logs(elasticFunction)
		t.Fatalf("%s: %s %s\n%s", payload, inv.Outcome, inv.Response, tail(logs, 30))
	}
	return a
}

// A backlog larger than one invocation can deliver before its deadline
// starts workers by fan-out; they drain it side by side, never more at once
// than the function's reserved concurrency, each message delivered exactly
// once, and fan-out stops once the queue is empty.
func TestFanOutDrainsABacklogWithinTheConcurrencyLimit(t *testing.T) {
	t.Parallel()
	const (
		messages = 3000
		reserved = 4
	)
	db := pgtest.New(t)
	// A target of 50 ms with two calls in flight per invocation: about 40
	// messages a second each, so that one invocation of 30 s (27 s of
	// claiming) cannot take the backlog alone, and the fleet can.
	target := startTarget(t, 50*time.Millisecond)
	backlog(t, db, messages)
	e := emulated(t, db, target, 2, lambdaemu.FunctionConfig{
		Timeout: 30 * time.Second, MemoryMB: 256, ReservedConcurrency: reserved,
		Async: lambdaemu.AsyncConfig{MaximumEventAge: time.Minute, ThrottleBackoff: 200 * time.Millisecond, MaxThrottleBackoff: time.Second},
	}, "OUTBOX_BATCH_SIZE=20", "OUTBOX_MAX_BATCHES=2", "OUTBOX_SAFETY_MARGIN=3s",
		fmt.Sprintf("OUTBOX_MAX_WORKERS=%d", reserved), "OUTBOX_LINGER=off")

	// The schedule's invocation, then whatever it started; ticks again
	// (as the schedule would) while messages remain, at most a few times.
	for tick := 0; tick < 4 && count(t, db.Pool, `SELECT count(*) FROM outbox.pending`) > 0; tick++ {
		first := invokeEmulated(t, e, `{}`)
		if tick == 0 && (first.FanOut == nil || first.FanOut.Started < 2) {
			t.Fatalf("the first invocation started no fleet: %+v", first.FanOut)
		}
		waitIdle(t, e, 2*time.Minute)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`); n != 0 {
		t.Fatalf("%d messages left pending after four ticks", n)
	}
	stats, err := e.Stats(elasticFunction)
	if err != nil {
		t.Fatal(err)
	}
	var workers, delivered int
	for _, a := range answers(t, e) {
		delivered += a.Delivered
		if a.Generation > 0 {
			workers++
		}
	}
	c := target.Counts()
	switch {
	case stats.MaxConcurrency > reserved:
		t.Errorf("%d invocations at once, over the reserved concurrency of %d", stats.MaxConcurrency, reserved)
	case stats.MaxConcurrency < 3:
		t.Errorf("at most %d invocations at once: the fleet never ran side by side", stats.MaxConcurrency)
	case workers < 2:
		t.Errorf("%d fan-out workers ran", workers)
	case target.Received() != messages || c.Duplicates != 0 || c.Calls != messages || delivered != messages:
		t.Errorf("target received %d of %d distinct messages in %d calls (%d duplicates); the answers count %d delivered",
			target.Received(), messages, c.Calls, c.Duplicates, delivered)
	}
	t.Logf("%d invocations (%d workers), at most %d at once; %d async accepted, %d throttled",
		stats.Invocations, workers, stats.MaxConcurrency, stats.AsyncAccepted, stats.AsyncThrottles)

	// The queue is empty: a tick drains nothing and starts nobody.
	accepted := stats.AsyncAccepted
	if a := invokeEmulated(t, e, `{}`); a.FanOut != nil || a.Claimed != 0 {
		t.Errorf("a tick on an empty queue: claimed %d, fan-out %+v", a.Claimed, a.FanOut)
	}
	waitIdle(t, e, time.Minute)
	if stats, _ := e.Stats(elasticFunction); stats.AsyncAccepted != accepted {
		t.Errorf("%d invocations started on an empty queue", stats.AsyncAccepted-accepted)
	}
}

// An invocation of the generation limit starts nothing, however large the
// backlog; a chain started below it never grows past it.
func TestFanOutChainStopsAtItsGenerationLimit(t *testing.T) {
	t.Parallel()
	const limit = 2
	db := pgtest.New(t)
	target := startTarget(t, 50*time.Millisecond)
	backlog(t, db, 2000)
	e := emulated(t, db, target, 2, lambdaemu.FunctionConfig{
		Timeout: 15 * time.Second, MemoryMB: 256, ReservedConcurrency: 3,
		Async: lambdaemu.AsyncConfig{MaximumEventAge: 20 * time.Second, ThrottleBackoff: 200 * time.Millisecond, MaxThrottleBackoff: time.Second},
	}, "OUTBOX_BATCH_SIZE=20", "OUTBOX_MAX_BATCHES=2",
		// Runs go on until the deadline less the margin; 6 s leaves a
		// machine busy with the rest of the suite time for the last
		// completion (with 3 s, one invocation timed out in a loaded run).
		"OUTBOX_SAFETY_MARGIN=6s", "OUTBOX_MAX_WORKERS=3",
		fmt.Sprintf("OUTBOX_FANOUT_GENERATIONS=%d", limit), "OUTBOX_LINGER=off")

	atLimit := invokeEmulated(t, e, fmt.Sprintf(`{"source":%q,"generation":%d,"reason":"backlog","backlog":2000}`, fanout.Source, limit))
	if atLimit.FanOut == nil || atLimit.FanOut.Skipped != fanout.SkippedGenerationLimit || atLimit.FanOut.Wanted != 0 {
		t.Fatalf("an invocation of generation %d decided %+v, want it skipped at the generation limit", limit, atLimit.FanOut)
	}
	if stats, _ := e.Stats(elasticFunction); stats.AsyncAccepted != 0 {
		t.Fatalf("an invocation at the generation limit started %d invocations", stats.AsyncAccepted)
	}

	// A chain from generation 1: it starts generation 2, which starts none.
	invokeEmulated(t, e, fmt.Sprintf(`{"source":%q,"generation":1,"reason":"backlog","backlog":2000}`, fanout.Source))
	waitIdle(t, e, 2*time.Minute)
	generations := map[int]int{}
	for _, a := range answers(t, e) {
		generations[a.Generation]++
		if a.Generation >= limit && a.FanOut != nil && a.FanOut.Skipped != fanout.SkippedGenerationLimit {
			t.Errorf("a generation-%d invocation decided %+v", a.Generation, a.FanOut)
		}
	}
	if generations[limit] < 2 || len(generations) != 2 {
		t.Errorf("invocations by generation %v: want generation 1 and the generation-%d ones it started, and none beyond", generations, limit)
	}
}

// A lingering invocation delivers a message committed after it drained:
// woken by NOTIFY on its own connection, or with LISTEN off by polling. It
// lingers until its deadline less the safety margin and returns then, with
// the completion reserve intact.
func TestLingeringInvocationDeliversALateCommit(t *testing.T) {
	t.Parallel()
	const (
		timeout = 15 * time.Second
		margin  = 3 * time.Second
	)
	for _, listen := range []string{"on", "off"} {
		t.Run("listen "+listen, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			target := startTarget(t, 0)
			e := emulated(t, db, target, 8, lambdaemu.FunctionConfig{Timeout: timeout, MemoryMB: 256},
				"OUTBOX_LINGER=on", "OUTBOX_LISTEN="+listen, "OUTBOX_POLL_INTERVAL=100ms",
				fmt.Sprintf("OUTBOX_SAFETY_MARGIN=%s", margin))
			enqueueOne := func(tokens int) string {
				res, err := outbox.Enqueue(t.Context(), db.Pool, outbox.Message{Namespace: "billing", Topic: "usage",
					Payload: json.RawMessage(fmt.Sprintf(`{"tokens":%d}`, tokens))})
				if err != nil {
					t.Fatal(err)
				}
				return res.ID.String()
			}
			received := func(id string, bound time.Duration) bool {
				for deadline := time.Now().Add(bound); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					for got := range target.Receipts() {
						if got.String() == id {
							return true
						}
					}
				}
				return false
			}
			early := enqueueOne(1)
			done := make(chan lambdaemu.Invocation, 1)
			go func() {
				inv, err := e.Invoke(elasticFunction, []byte(`{}`))
				if err != nil {
					t.Error(err)
				}
				done <- inv
			}()
			if !received(early, 10*time.Second) {
				t.Fatal("the message committed before the invocation was not delivered")
			}
			// The invocation has drained and lingers: commit another.
			time.Sleep(500 * time.Millisecond)
			late := enqueueOne(2)
			if !received(late, timeout) {
				t.Fatal("the message committed while the invocation lingered was not delivered by it")
			}
			inv := <-done
			var a dispatchfn.Answer
			if inv.Outcome != lambdaemu.OutcomeSucceeded || json.Unmarshal(inv.Response, &a) != nil {
				t.Fatalf("invocation: %s %s", inv.Outcome, inv.Response)
			}
			if stats, _ := e.Stats(elasticFunction); stats.Invocations != 1 {
				t.Fatalf("%d invocations, want the one that lingered", stats.Invocations)
			}
			if a.Delivered != 2 || a.Runs < 2 || a.LingeredMS == 0 || a.DurationMS < (timeout-margin-time.Second).Milliseconds() {
				t.Errorf("answer %+v: want both messages delivered by runs after lingering", a)
			}
			// With LISTEN, a notification woke it: the subscription's
			// catch-up is one wake-up, the late commit's another. Without,
			// only polls did.
			if listen == "on" && a.NotifyWakeups < 2 {
				t.Errorf("%d NOTIFY wake-ups, want the subscription's and the commit's", a.NotifyWakeups)
			}
			if listen == "off" && (a.NotifyWakeups != 0 || a.Polls == 0) {
				t.Errorf("LISTEN off: %d NOTIFY wake-ups, %d polls", a.NotifyWakeups, a.Polls)
			}
			// It lingered to its deadline less the safety margin, and
			// returned before the completion reserve (half the margin here)
			// began: the deadline was not what ended it.
			took, reserve := inv.Duration(), margin/2
			if took < timeout-margin-time.Second || took > timeout-reserve {
				t.Errorf("the invocation took %s of its %s: want it to linger to %s and return before %s",
					took, timeout, timeout-margin, timeout-reserve)
			}
			// The subscription ended with the invocation (the connection
			// stays for the next): a frozen environment holds none.
			if listen == "on" {
				var last string
				if err := db.Pool.QueryRow(t.Context(), `SELECT query FROM pg_stat_activity
					WHERE datname = current_database() AND application_name = $1`, dispatchfn.ListenApplicationName).Scan(&last); err != nil {
					t.Fatal(err)
				}
				if last != "UNLISTEN *" {
					t.Errorf("the listener's last statement was %q, want UNLISTEN *", last)
				}
			}
		})
	}
}

// holdingTarget is a webhook that holds every call until released: the
// calls of the invocation killed mid-batch never answer. Once released it
// answers at once and records each message's first arrival.
type holdingTarget struct {
	*httptest.Server
	mu       sync.Mutex
	held     bool
	arrivals map[string]time.Time
	started  chan struct{}
	once     sync.Once
	// released ends the calls held so far (their caller is dead).
	released chan struct{}
}

func newHoldingTarget(t *testing.T) *holdingTarget {
	h := &holdingTarget{held: true, arrivals: map[string]time.Time{}, started: make(chan struct{}), released: make(chan struct{})}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h.once.Do(func() { close(h.started) })
		h.mu.Lock()
		held := h.held
		h.mu.Unlock()
		if held {
			select {
			case <-r.Context().Done():
			case <-h.released:
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		id := r.Header.Get("webhook-id")
		h.mu.Lock()
		if _, seen := h.arrivals[id]; !seen {
			h.arrivals[id] = time.Now()
		}
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *holdingTarget) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = false
	close(h.released)
}

func (h *holdingTarget) received() (n int, last time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, at := range h.arrivals {
		if at.After(last) {
			last = at
		}
	}
	return len(h.arrivals), last
}

// With the template's defaults — its schedule, timeout, safety margin,
// linger and listen, none compressed — the messages of an invocation killed
// mid-batch are delivered within 120 s of the kill: their lease is the
// invocation's time left plus the safety margin, and the next claim after
// it expires takes them over (the lingering invocation of the next tick
// claims every few seconds even when no notification comes).
func TestKilledInvocationsMessagesAreDeliveredWithinTwoMinutes(t *testing.T) {
	t.Parallel()
	const messages = 50
	db := pgtest.New(t)
	target := newHoldingTarget(t)
	e, err := lambdaemu.New(lambdaemu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	routes := fmt.Sprintf(`{"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET"}}]}`, target.URL)
	if err := e.Register(lambdaemu.FunctionConfig{
		Name: elasticFunction, Binary: lambdatest.Build(t, "dispatch"), Timeout: deploybench.TemplateTimeout,
		MemoryMB: deploybench.TemplateMemoryMB, ReservedConcurrency: deploybench.TemplateMaxWorkers,
		Async: lambdaemu.AsyncConfig{MaximumEventAge: deploybench.TemplateMaximumEventAge},
		Env: append(deploybench.TemplateEnv(deploybench.TemplateTimeout),
			"OUTBOX_DATABASE_URL="+db.URL, "OUTBOX_ROUTES="+routes, "SINK_SECRET="+sinkSecret, "OUTBOX_TRACING=off"),
	}); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, messages, usage)
	schedule, err := e.Schedule(lambdaemu.ScheduleConfig{Function: elasticFunction, Expression: deploybench.TemplateSchedule, FirstTickAfter: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer schedule.Stop()
	select {
	case <-target.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the first invocation never called the target")
	}
	requestID, ok, err := e.KillBusy(elasticFunction)
	if err != nil || !ok {
		t.Fatalf("kill: %v, %v", ok, err)
	}
	killed := time.Now()
	target.release()
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NOT NULL`); n != messages {
		t.Fatalf("%d messages leased after the kill of %s, want all %d mid-batch", n, requestID, messages)
	}
	const bound = 120 * time.Second
	for n, _ := target.received(); n < messages && time.Since(killed) < bound; n, _ = target.received() {
		time.Sleep(100 * time.Millisecond)
	}
	n, last := target.received()
	if n != messages {
		t.Fatalf("%d of %d messages delivered within %s of the kill", n, messages, bound)
	}
	t.Logf("the killed invocation's messages were delivered %s after the kill", last.Sub(killed).Round(time.Millisecond))
	// Taken over by a claim, not the reaper (which this deployment lacks).
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE' AND worker_id NOT LIKE 'reaper:%'`); n != messages {
		t.Errorf("%d ZOMBIE_REQUEUE attempts by a claimer, want %d", n, messages)
	}
}
