package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// target is an in-process publisher: it records what it accepts and answers
// what the test programs, standing in for a remote target.
type target struct {
	mu        sync.Mutex
	delivered map[uuid.UUID]int
	calls     int
	batches   []int // messages per Publish, in order
	delay     time.Duration
	answer    func(m *outboxtype.Message) publish.Result
	// published is every message handed to Publish, as the engine holds
	// it, and payloadBytes their payloads' size when they were.
	published    []*outboxtype.Message
	payloadBytes int
}

func newTarget() *target { return &target{delivered: map[uuid.UUID]int{}} }

func (t *target) Publish(ctx context.Context, msgs []*outboxtype.Message) []publish.Result {
	t.mu.Lock()
	t.calls++
	t.batches = append(t.batches, len(msgs))
	t.published = append(t.published, msgs...)
	for _, m := range msgs {
		t.payloadBytes += len(m.Payload)
	}
	delay, answer := t.delay, t.answer
	t.mu.Unlock()
	// One message per call, all at once, through the scheduler every real
	// publisher uses: an ordered key's messages go one after another and
	// stop at the first that is not delivered.
	b := publish.Batcher[*outboxtype.Message]{
		MaxEntries:  1,
		Concurrency: max(len(msgs), 1),
		Prepare:     func(m *outboxtype.Message) (*outboxtype.Message, int, *publish.Result) { return m, 0, nil },
		Call: func(ctx context.Context, _ []*outboxtype.Message, entries []*outboxtype.Message, results []publish.Result) bool {
			if delay > 0 {
				select {
				case <-time.After(delay):
				case <-ctx.Done():
					for j := range results {
						results[j] = publish.Retry(outboxtype.CodeCanceled, ctx.Err(), 0)
					}
					return false
				}
			}
			t.mu.Lock()
			defer t.mu.Unlock()
			for j, m := range entries {
				results[j] = publish.Ok("ref-" + m.ID.String()[:8])
				if answer != nil {
					results[j] = answer(m)
				}
				if results[j].Kind == publish.Delivered {
					t.delivered[m.ID]++
				}
			}
			return false
		},
	}
	return b.Publish(ctx, msgs)
}

func (t *target) deliveredCount() (distinct, total int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range t.delivered {
		distinct++
		total += n
	}
	return
}

const routesJSON = `{"routes": [
  {"match": {"namespace": "billing", "topic": "*"},
   "target": {"type": "http", "url": "http://localhost:9/usage", "signing_secret_env": "SECRET"},
   "retry": {"max_attempts": 3, "base_delay": "1s", "max_delay": "4s"},
   "max_payload_bytes": 2048,
   "schema": {"type": "object", "required": ["n"]}},
  {"match": {"namespace": "payments", "topic": "*"},
   "target": {"type": "sns", "topic_arn": "arn:aws:sns:us-east-1:123456789012:payments"}}
]}`

type fixture struct {
	db      *pgtest.DB
	store   *lease.Store
	billing *target
	payment *target
	table   *route.Table
}

func setup(t *testing.T) *fixture {
	t.Helper()
	db := pgtest.NewWithConfig(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	table, err := route.Parse([]byte(routesJSON), route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{db: db, store: lease.NewStore(db.Pool), billing: newTarget(), payment: newTarget(), table: table}
}

func (f *fixture) engine(t *testing.T, cfg dispatch.Config) *dispatch.Engine {
	t.Helper()
	pubs := map[string]publish.Publisher{
		f.table.Routes[0].Target.Key(): f.billing,
		f.table.Routes[1].Target.Key(): f.payment,
	}
	e, err := dispatch.New(cfg, f.store, f.table, pubs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (f *fixture) enqueue(t *testing.T, n int, build func(i int) outbox.Message) {
	t.Helper()
	for start := 0; start < n; start += 1000 {
		var batch []outbox.Message
		for i := start; i < min(n, start+1000); i++ {
			batch = append(batch, build(i))
		}
		if _, err := outbox.EnqueueBatch(context.Background(), f.db.Pool, batch); err != nil {
			t.Fatal(err)
		}
	}
}

func billingMsg(i int) outbox.Message {
	return outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
}

func (f *fixture) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestRunDrainsAcrossTargets(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.enqueue(t, 1500, func(i int) outbox.Message {
		m := billingMsg(i)
		if i%3 == 0 {
			m.Namespace = "payments"
		}
		return m
	})
	sum, err := f.engine(t, dispatch.Config{BatchSize: 400}).Run(context.Background(), dispatch.Request{WorkerID: "w-1"})
	if err != nil {
		t.Fatal(err)
	}
	if sum.StoppedBy != dispatch.StoppedDrained || sum.Claimed != 1500 || sum.Delivered != 1500 || sum.Batches != 4 || sum.Dead+sum.Retried+sum.LeaseLost != 0 {
		t.Fatalf("summary %+v", sum)
	}
	if d, total := f.billing.deliveredCount(); d != 1000 || total != 1000 {
		t.Fatalf("billing target got %d distinct / %d deliveries, want 1000", d, total)
	}
	if d, _ := f.payment.deliveredCount(); d != 500 {
		t.Fatalf("payments target got %d, want 500", d)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED' AND target_ref LIKE 'ref-%' AND worker_id = 'w-1'`); n != 1500 {
		t.Fatalf("%d DISPATCHED attempts with target refs", n)
	}
	if sum.Targets["http"].Delivered != 1000 || sum.Targets["sns"].Delivered != 500 || len(sum.Targets["sns"].Latencies) == 0 {
		t.Fatalf("per-target figures %+v %+v", sum.Targets["http"], sum.Targets["sns"])
	}
}

// Once a batch is published the engine lets go of its payloads: its
// completion records outcomes, and the claim's byte budget counts on the
// payloads of two batches in memory at once (the one published, the one
// claimed ahead), not of three with the batch completing behind.
func TestPublishedBatchesLetGoOfTheirPayloads(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.enqueue(t, 300, billingMsg)
	sum, err := f.engine(t, dispatch.Config{BatchSize: 100}).Run(context.Background(), dispatch.Request{WorkerID: "w"})
	if err != nil || sum.Delivered != 300 {
		t.Fatalf("summary %+v, %v: want 300 delivered", sum, err)
	}
	if len(f.billing.published) != 300 || f.billing.payloadBytes < 300*len(`{"n":0}`) {
		t.Fatalf("the target was handed %d messages with %d bytes of payload, want 300 with theirs", len(f.billing.published), f.billing.payloadBytes)
	}
	for _, m := range f.billing.published {
		if m.Payload != nil {
			t.Fatalf("message %s still holds its payload %s after its batch was published and completed", m.ID, m.Payload)
		}
	}
}

func TestRunStopsAtMaxBatches(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.enqueue(t, 500, billingMsg)
	e := f.engine(t, dispatch.Config{BatchSize: 100, MaxBatches: 10})
	sum, err := e.Run(context.Background(), dispatch.Request{WorkerID: "w", BatchSize: 50, MaxBatches: 3})
	if err != nil {
		t.Fatal(err)
	}
	if sum.StoppedBy != dispatch.StoppedMaxBatches || sum.Batches != 3 || sum.Delivered != 150 {
		t.Fatalf("summary %+v, want 3 batches of 50 and stopped_by max_batches", sum)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.pending`); n != 350 {
		t.Fatalf("%d left pending, want 350", n)
	}
}

func TestTerminalOutcomesAreDeadLettered(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.billing.answer = func(m *outboxtype.Message) publish.Result {
		if strings.Contains(string(m.Payload), `"poison"`) {
			return publish.Fail(outboxtype.CodeTargetRejected, errors.New("HTTP 422: unknown tenant"))
		}
		return publish.Ok("ok")
	}
	f.enqueue(t, 5, func(i int) outbox.Message {
		m := billingMsg(i)
		switch i {
		case 0:
			m.Namespace = "unrouted" // no route
		case 1:
			m.Payload = json.RawMessage(`{"n":1,"pad":"` + strings.Repeat("x", 3000) + `"}`) // over the route's 2048
		case 2:
			m.Payload = json.RawMessage(`{"missing":"n"}`) // fails the schema
		case 3:
			m.Payload = json.RawMessage(`{"n":3,"poison":true}`) // refused by the target
		}
		return m
	})
	sum, err := f.engine(t, dispatch.Config{}).Run(context.Background(), dispatch.Request{WorkerID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	// The unrouted message is held, not dead: a route may be added for it.
	if sum.Dead != 3 || sum.Delivered != 1 || sum.Held != 1 {
		t.Fatalf("summary %+v, want 3 dead, 1 held and 1 delivered", sum)
	}
	rows, err := f.db.Pool.Query(context.Background(), `SELECT last_error_code, last_error FROM outbox.dead ORDER BY sequence_id NULLS FIRST, created_at, id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var code, msg string
		rows.Scan(&code, &msg)
		got[code] = msg
	}
	for code, want := range map[string]string{
		"PAYLOAD_TOO_LARGE": "over routes[0]'s max_payload_bytes of 2048",
		"INVALID_PAYLOAD":   "fails routes[0]'s schema",
		"TARGET_REJECTED":   "unknown tenant",
	} {
		if !strings.Contains(got[code], want) {
			t.Errorf("dead letter %s: %q, want it to mention %q", code, got[code], want)
		}
	}
	if _, calls := f.billing.deliveredCount(); calls != 1 {
		t.Errorf("the target accepted %d messages, want only the good one", calls)
	}
}

func TestRetryableOutcomesFollowTheRoutePolicy(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.billing.answer = func(*outboxtype.Message) publish.Result {
		return publish.Retry(outboxtype.CodeThrottled, errors.New("429 Too Many Requests"), 3*time.Second)
	}
	f.enqueue(t, 1, billingMsg)
	noJitter := func(d time.Duration) time.Duration { return 0 }
	e := f.engine(t, dispatch.Config{Jitter: noJitter})
	for attempt := 1; attempt <= 3; attempt++ {
		sum, err := e.Run(context.Background(), dispatch.Request{WorkerID: "w"})
		if err != nil {
			t.Fatal(err)
		}
		if attempt < 3 {
			if sum.Retried != 1 {
				t.Fatalf("attempt %d: %+v, want retried", attempt, sum)
			}
			var wait float64
			f.db.Pool.QueryRow(context.Background(), `SELECT extract(epoch FROM next_attempt_at - now()) FROM outbox.pending`).Scan(&wait)
			if wait < 2 || wait > 3.5 {
				t.Fatalf("attempt %d rescheduled %.1fs ahead, want the target's Retry-After of 3s", attempt, wait)
			}
			f.db.Pool.Exec(context.Background(), `UPDATE outbox.pending SET next_attempt_at = now()`)
			continue
		}
		if sum.Dead != 1 {
			t.Fatalf("attempt 3 of 3: %+v, want dead", sum)
		}
	}
	var msg string
	f.db.Pool.QueryRow(context.Background(), `SELECT last_error FROM outbox.dead`).Scan(&msg)
	if !strings.Contains(msg, "retries exhausted after attempt 3 of 3") || !strings.Contains(msg, "429") {
		t.Fatalf("dead letter reason %q", msg)
	}
}

type brokenPublisher struct{ panics bool }

func (b brokenPublisher) Publish(_ context.Context, msgs []*outboxtype.Message) []publish.Result {
	if b.panics {
		panic("boom")
	}
	return make([]publish.Result, len(msgs)-1)
}

func TestMisbehavingPublisherLosesNothing(t *testing.T) {
	t.Parallel()
	for _, p := range []brokenPublisher{{panics: true}, {panics: false}} {
		f := setup(t)
		f.enqueue(t, 3, billingMsg)
		pubs := map[string]publish.Publisher{f.table.Routes[0].Target.Key(): p, f.table.Routes[1].Target.Key(): f.payment}
		e, err := dispatch.New(dispatch.Config{}, f.store, f.table, pubs, nil)
		if err != nil {
			t.Fatal(err)
		}
		// One batch: a retry whose jittered delay is near zero would
		// otherwise be claimed again within the run.
		sum, err := e.Run(context.Background(), dispatch.Request{WorkerID: "w", MaxBatches: 1})
		if err != nil || sum.Retried != 3 {
			t.Fatalf("panics=%v: %+v %v, want all 3 retried", p.panics, sum, err)
		}
		if n := f.count(t, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NULL`); n != 3 {
			t.Fatalf("%d messages back in the queue, want 3", n)
		}
	}
}

func TestDeadlineStopsClaimingAndCompletesWhatItHolds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.billing.delay = 400 * time.Millisecond
	f.enqueue(t, 5000, billingMsg)
	e := f.engine(t, dispatch.Config{BatchSize: 100, MaxBatches: 1000, SafetyMargin: 1500 * time.Millisecond, CompletionReserve: 500 * time.Millisecond, Lease: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	sum, err := e.Run(ctx, dispatch.Request{WorkerID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if sum.StoppedBy != dispatch.StoppedDeadline {
		t.Fatalf("stopped by %q, want deadline (%+v)", sum.StoppedBy, sum)
	}
	if sum.DurationMS < 1000 || sum.DurationMS > 3000 {
		t.Fatalf("duration_ms %d for a run of about 1.5-3s", sum.DurationMS)
	}
	if time.Now().After(deadline) {
		t.Fatalf("returned after the deadline")
	}
	if sum.Claimed == 0 || sum.Claimed != sum.Delivered+sum.Retried+sum.Dead+sum.LeaseLost {
		t.Fatalf("claimed %d but accounted for %d", sum.Claimed, sum.Delivered+sum.Retried+sum.Dead+sum.LeaseLost)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NOT NULL`); n != 0 {
		t.Fatalf("%d messages left leased after a clean deadline stop", n)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.attempts`); n != sum.Claimed {
		t.Fatalf("%d attempts for %d claims: a message completed twice or not at all", n, sum.Claimed)
	}
	if d, total := f.billing.deliveredCount(); d != total || d != sum.Delivered {
		t.Fatalf("target saw %d distinct / %d deliveries, summary says %d", d, total, sum.Delivered)
	}
}

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// slowTarget delivers everything and takes took of the fake clock per
// Publish, noting how much time was left before deadline when each began.
type slowTarget struct {
	clock    *fakeClock
	took     time.Duration
	deadline time.Time
	mu       sync.Mutex
	leftAt   []time.Duration
}

func (s *slowTarget) Publish(_ context.Context, msgs []*outboxtype.Message) []publish.Result {
	s.mu.Lock()
	s.leftAt = append(s.leftAt, s.deadline.Sub(s.clock.Now()))
	s.mu.Unlock()
	s.clock.advance(s.took)
	return publish.Fill(len(msgs), publish.Ok("ok"))
}

func TestEveryBatchStartsPublishingWithTheSafetyMarginLeft(t *testing.T) {
	t.Parallel()
	const margin = 1500 * time.Millisecond
	for _, tc := range []struct {
		name        string
		perBatch    time.Duration
		wantBatches int
	}{
		// 3 s left: batches begin publishing at 3.0, 2.6, 2.2 and 1.8 s; a
		// fifth would begin at 1.4 s, inside the margin.
		{"fast batches", 400 * time.Millisecond, 4},
		// The first batch leaves 1 s: a second, had it been claimed ahead
		// while the first was published, would begin inside the margin.
		{"a first batch slower than the time left after it", 2 * time.Second, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			f.enqueue(t, 1000, billingMsg)
			// The context's deadline is a minute away in real time, so that
			// it never fires; the engine's clock starts 3 s before it and
			// moves only while a batch is published.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			deadline, _ := ctx.Deadline()
			clock := &fakeClock{now: deadline.Add(-3 * time.Second)}
			slow := &slowTarget{clock: clock, took: tc.perBatch, deadline: deadline}
			pubs := map[string]publish.Publisher{f.table.Routes[0].Target.Key(): slow, f.table.Routes[1].Target.Key(): f.payment}
			e, err := dispatch.New(dispatch.Config{BatchSize: 100, MaxBatches: 1000, SafetyMargin: margin, CompletionReserve: 500 * time.Millisecond, Lease: time.Minute, Clock: clock.Now}, f.store, f.table, pubs, nil)
			if err != nil {
				t.Fatal(err)
			}
			sum, err := e.Run(ctx, dispatch.Request{WorkerID: "w"})
			if err != nil {
				t.Fatal(err)
			}
			if sum.StoppedBy != dispatch.StoppedDeadline || sum.Batches != tc.wantBatches || sum.Delivered != 100*tc.wantBatches {
				t.Fatalf("summary %+v, want %d batches delivered and a deadline stop", sum, tc.wantBatches)
			}
			for i, left := range slow.leftAt {
				if left < margin {
					t.Errorf("batch %d began publishing with %s left, inside the %s safety margin", i+1, left, margin)
				}
			}
			if n := f.count(t, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NOT NULL`); n != 0 {
				t.Fatalf("%d messages left leased", n)
			}
		})
	}
}

// Under a deadline, a claim's lease is the time the run has left plus the
// safety margin, not a fixed lease: a killed invocation's messages are
// claimable soon after its deadline. Without one it is Config.Lease.
func TestClaimLeaseIsTheTimeLeftPlusTheSafetyMargin(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const margin = 3 * time.Second
	var mu sync.Mutex
	var expires []time.Time
	f.billing.answer = func(m *outboxtype.Message) publish.Result {
		mu.Lock()
		defer mu.Unlock()
		expires = append(expires, m.LeaseExpiresAt)
		return publish.Ok("ref")
	}
	e := f.engine(t, dispatch.Config{Lease: time.Hour, SafetyMargin: margin})
	for _, left := range []time.Duration{40 * time.Second, 5 * time.Minute} {
		f.enqueue(t, 1, billingMsg)
		ctx, cancel := context.WithTimeout(context.Background(), left)
		deadline, _ := ctx.Deadline()
		if _, err := e.Run(ctx, dispatch.Request{WorkerID: "w"}); err != nil {
			t.Fatal(err)
		}
		cancel()
		mu.Lock()
		got := expires[len(expires)-1]
		mu.Unlock()
		// The database rounds the lease up to the second and its clock
		// counts from the claim, a moment after the run began.
		if want := deadline.Add(margin); got.Before(want.Add(-time.Second)) || got.After(want.Add(2*time.Second)) {
			t.Errorf("with %s left the lease expires at %s, want the deadline plus %s: %s", left, got.Format(time.RFC3339Nano), margin, want.Format(time.RFC3339Nano))
		}
	}
	f.enqueue(t, 1, billingMsg)
	before := time.Now()
	if _, err := e.Run(context.Background(), dispatch.Request{WorkerID: "w"}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := expires[len(expires)-1]
	mu.Unlock()
	if got.Before(before.Add(time.Hour-time.Second)) || got.After(before.Add(time.Hour+5*time.Second)) {
		t.Errorf("without a deadline the lease expires at %s, want Config.Lease (1h) after %s", got, before)
	}
	_, err := dispatch.New(dispatch.Config{Lease: 5 * time.Second, SafetyMargin: 10 * time.Second}, f.store, f.table,
		map[string]publish.Publisher{f.table.Routes[0].Target.Key(): f.billing, f.table.Routes[1].Target.Key(): f.payment}, nil)
	if err == nil || !strings.Contains(err.Error(), "Lease (5s) must be longer than SafetyMargin (10s)") {
		t.Fatalf("New with a lease inside the safety margin: %v", err)
	}
}

func TestMissingPublisherFailsTheColdStart(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := dispatch.New(dispatch.Config{}, f.store, f.table, map[string]publish.Publisher{f.table.Routes[0].Target.Key(): f.billing}, nil)
	if err == nil || !strings.Contains(err.Error(), "no publisher for routes[1]") {
		t.Fatalf("err = %v", err)
	}
}

// recordingStore wraps the real store and notes when claims and
// completions start, so that a test can see what overlapped what.
type recordingStore struct {
	*lease.Store
	mu       sync.Mutex
	events   []string
	claimed  chan struct{} // one value per claim started
	complete chan struct{} // one value per completion started
}

func (s *recordingStore) note(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *recordingStore) ClaimBatch(ctx context.Context, p lease.ClaimParams) ([]outboxtype.Message, error) {
	s.note("claim")
	s.claimed <- struct{}{}
	return s.Store.ClaimBatch(ctx, p)
}

func (s *recordingStore) CompleteBatch(ctx context.Context, w string, r []lease.Result) ([]lease.Completion, error) {
	s.note("complete")
	s.complete <- struct{}{}
	return s.Store.CompleteBatch(ctx, w, r)
}

// gatedTarget holds each publish until the event it waits for has happened.
type gatedTarget struct {
	store *recordingStore
	calls int
}

func (g *gatedTarget) Publish(ctx context.Context, msgs []*outboxtype.Message) []publish.Result {
	g.calls++
	g.store.note(fmt.Sprintf("publish %d", g.calls))
	wait := func(ch chan struct{}, what string) bool {
		select {
		case <-ch:
			return true
		case <-time.After(10 * time.Second):
			g.store.note("timed out waiting for " + what)
			return false
		}
	}
	// Publishing batch n must not wait for batch n+1's claim nor batch n-1's
	// completion: both run while it publishes.
	wait(g.store.claimed, "the next claim")
	if g.calls > 1 {
		wait(g.store.complete, "the previous completion")
	}
	return publish.Fill(len(msgs), publish.Ok("ok"))
}

func TestRunOverlapsDatabaseCallsWithPublishing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.enqueue(t, 30, billingMsg)
	rec := &recordingStore{Store: f.store, claimed: make(chan struct{}, 10), complete: make(chan struct{}, 10)}
	// The first claim is not overlapped: drain its signal.
	gate := &gatedTarget{store: rec}
	pubs := map[string]publish.Publisher{f.table.Routes[0].Target.Key(): gate, f.table.Routes[1].Target.Key(): f.payment}
	e, err := dispatch.New(dispatch.Config{BatchSize: 10}, rec, f.table, pubs, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { <-rec.claimed }() // the first claim happens before any publish
	sum, err := e.Run(context.Background(), dispatch.Request{WorkerID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	events := strings.Join(rec.events, ", ")
	rec.mu.Unlock()
	if strings.Contains(events, "timed out") {
		t.Fatalf("publishing waited for a database call that should have run alongside it: %s", events)
	}
	if sum.Delivered != 30 || sum.Batches != 3 || sum.StoppedBy != dispatch.StoppedDrained {
		t.Fatalf("summary %+v (events %s)", sum, events)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != 30 {
		t.Fatalf("%d DISPATCHED attempts, want 30", n)
	}
}

// A configuration failure (access denied, a missing target or route) is
// the deployment's, not the message's: the message is held — retried with
// a capped backoff, each attempt recorded, never dead-lettered however many
// attempts it takes, an ordered key's later messages still waiting behind
// it — unless its route says on_config_error: dead.
func TestConfigurationFailuresHoldMessages(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.store.AttemptCeiling = 3
	f.billing.answer = func(*outboxtype.Message) publish.Result {
		return publish.Fail(outboxtype.CodeAccessDenied, errors.New("AuthorizationError: not authorized to perform sns:Publish"))
	}
	f.payment.answer = func(*outboxtype.Message) publish.Result {
		return publish.Fail(outboxtype.CodeTargetNotFound, errors.New("NotFound: Topic does not exist"))
	}
	f.enqueue(t, 4, func(i int) outbox.Message {
		m := billingMsg(i)
		m.OrderingKey = "tenant-1"
		return m
	})
	f.enqueue(t, 2, func(i int) outbox.Message {
		return outbox.Message{Namespace: "payments", Topic: "captured", OrderingKey: "acct-9", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	})
	f.enqueue(t, 1, func(int) outbox.Message {
		return outbox.Message{Namespace: "unrouted", Topic: "t", Payload: json.RawMessage(`{}`)}
	})
	e := f.engine(t, dispatch.Config{OrderedRun: 10})
	for round := range 6 { // twice the attempt ceiling, and more than the route's max_attempts of 3
		sum, err := e.Run(context.Background(), dispatch.Request{WorkerID: "w", MaxBatches: 1})
		if err != nil {
			t.Fatal(err)
		}
		if sum.Dead != 0 || sum.Held != 3 || sum.Released != 4 {
			t.Fatalf("round %d: %+v, want both keys' heads (access denied, topic not found) and the unrouted message held, the keys' 4 later messages released", round, sum)
		}
		if round == 5 {
			t.Logf("round %d of an attempt ceiling of 3: claimed %d, held %d, released %d, dead %d", round+1, sum.Claimed, sum.Held, sum.Released, sum.Dead)
		}
		f.db.Pool.Exec(context.Background(), `UPDATE outbox.pending SET next_attempt_at = now()`)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.dead`); n != 0 {
		t.Fatalf("%d messages dead-lettered for a configuration failure", n)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.attempts WHERE state = 'RETRYABLE' AND error_code IN ('ACCESS_DENIED', 'TARGET_NOT_FOUND', 'NO_ROUTE')`); n != 18 {
		t.Fatalf("%d held attempts recorded, want 18 (3 messages, 6 rounds)", n)
	}
	t.Logf("archive: %d RETRYABLE attempts (ACCESS_DENIED, TARGET_NOT_FOUND, NO_ROUTE), %d dead letters",
		f.count(t, `SELECT count(*) FROM outbox.attempts WHERE state = 'RETRYABLE'`), f.count(t, `SELECT count(*) FROM outbox.dead`))
	if n := f.count(t, `SELECT count(*) FROM outbox.pending WHERE sequence_id > 1 AND attempt_count > 0`); n != 0 {
		t.Fatalf("%d later messages of the key were charged an attempt while its head was held", n)
	}

	// The same route, opting out: dead-lettered as before.
	table, err := route.Parse([]byte(strings.Replace(routesJSON, `"max_payload_bytes": 2048,`, `"max_payload_bytes": 2048, "on_config_error": "dead",`, 1)), route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.table = table
	f.db.Pool.Exec(context.Background(), `UPDATE outbox.pending SET next_attempt_at = now()`)
	sum, err := f.engine(t, dispatch.Config{OrderedRun: 10}).Run(context.Background(), dispatch.Request{WorkerID: "w", MaxBatches: 1})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Dead != 1 || sum.Held != 2 {
		t.Fatalf("with on_config_error dead on the billing route: %+v, want its key's head dead, the payments head and the unrouted message still held", sum)
	}
}

// A held message's backoff grows as a retry's but never past HoldMaxDelay,
// never runs out, and is never short enough for the run that held it to
// claim it again (a route's base_delay of 1 s drew 0.5–1 s, and the e2e
// run re-claimed its unrouted messages within the same invocation).
func TestHoldBackoffIsBounded(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, attempt := range []int{1, 2, 5, 50, 5000} {
		for _, jitter := range []backoff.Jitter{nil, func(time.Duration) time.Duration { return 0 }} {
			at := backoff.Default.Hold(now, attempt, dispatch.HoldMinDelay, dispatch.HoldMaxDelay, jitter)
			if d := at.Sub(now); d < dispatch.HoldMinDelay/2 || d > dispatch.HoldMaxDelay {
				t.Fatalf("attempt %d held for %s, want within [%s, %s]", attempt, d, dispatch.HoldMinDelay/2, dispatch.HoldMaxDelay)
			}
		}
	}
}

// claimNotingStore is the real store, noting what each claim returned.
// With failFirstBatch, the database fails under one completion: every
// completion of the run's first batch fails as a dropped connection does,
// everything else goes through.
type claimNotingStore struct {
	*lease.Store
	failFirstBatch bool
	mu             sync.Mutex
	claims         [][]outboxtype.Message
	failed         int
}

func (s *claimNotingStore) ClaimBatch(ctx context.Context, p lease.ClaimParams) ([]outboxtype.Message, error) {
	msgs, err := s.Store.ClaimBatch(ctx, p)
	s.mu.Lock()
	s.claims = append(s.claims, msgs)
	s.mu.Unlock()
	return msgs, err
}

func (s *claimNotingStore) CompleteBatch(ctx context.Context, w string, results []lease.Result) ([]lease.Completion, error) {
	s.mu.Lock()
	fail := s.failFirstBatch && slices.ContainsFunc(results, func(r lease.Result) bool {
		return slices.ContainsFunc(s.claims[0], func(m outboxtype.Message) bool { return m.ID == r.ID })
	})
	if fail {
		s.failed++
	}
	s.mu.Unlock()
	if fail {
		return nil, errors.New("unexpected EOF: the server closed the connection")
	}
	return s.Store.CompleteBatch(ctx, w, results)
}

func (s *claimNotingStore) claimed() []uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []uuid.UUID
	for _, c := range s.claims {
		for _, m := range c {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// When the database fails under a completion mid-run, the run stops with
// the error, and the batch it had already claimed ahead — leased, never
// published — is given back at once: unleased, its attempt counts as they
// were, nothing archived, instead of waiting out the lease for the reaper.
// The batch whose completion failed stays leased (its messages were
// published; only the reaper may decide their fate).
func TestFailedCompletionReleasesTheBatchClaimedAhead(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.enqueue(t, 30, billingMsg)
	// Earlier attempts, so that "unchanged" is told apart from "reset".
	if _, err := f.db.Pool.Exec(context.Background(), `UPDATE outbox.pending SET attempt_count = 2`); err != nil {
		t.Fatal(err)
	}
	store := &claimNotingStore{Store: f.store, failFirstBatch: true}
	pubs := map[string]publish.Publisher{f.table.Routes[0].Target.Key(): f.billing, f.table.Routes[1].Target.Key(): f.payment}
	e, err := dispatch.New(dispatch.Config{BatchSize: 10, Lease: time.Hour}, store, f.table, pubs, nil)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := e.Run(context.Background(), dispatch.Request{WorkerID: "w"})
	if err == nil || !strings.Contains(err.Error(), "server closed the connection") {
		t.Fatalf("run: %v (%+v), want the completion's failure", err, sum)
	}
	if store.failed == 0 {
		t.Fatal("no completion failed: the test exercised nothing")
	}

	f.billing.mu.Lock()
	published := map[uuid.UUID]bool{}
	for id := range f.billing.delivered {
		published[id] = true
	}
	f.billing.mu.Unlock()
	var unpublished []uuid.UUID
	for _, id := range store.claimed() {
		if !published[id] {
			unpublished = append(unpublished, id)
		}
	}
	// Batch 1 fails to complete while batch 2 publishes and batch 3 is
	// claimed ahead: batch 3 is what the run holds but never publishes.
	if len(unpublished) != 10 {
		t.Fatalf("%d messages claimed but not published, want the 10 claimed ahead", len(unpublished))
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.pending WHERE id = ANY ($1) AND lease_token IS NULL AND lease_expires_at IS NULL
		AND claimed_by IS NULL AND attempt_count = 2`, unpublished); n != 10 {
		t.Errorf("%d of the 10 claimed-ahead messages are back in the queue unleased with their attempt count unchanged", n)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.attempts WHERE message_id = ANY ($1)`, unpublished); n != 0 {
		t.Errorf("%d outcomes archived for messages that were never published", n)
	}
	var failedBatch []uuid.UUID
	for _, m := range store.claims[0] {
		failedBatch = append(failedBatch, m.ID)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.pending WHERE id = ANY ($1) AND lease_token IS NOT NULL`, failedBatch); n != 10 {
		t.Errorf("%d of the batch whose completion failed still leased, want 10 (the reaper's to requeue)", n)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != 10 || sum.Delivered != 10 {
		t.Errorf("%d DISPATCHED attempts, %d delivered in the summary; want batch 2's 10 recorded", n, sum.Delivered)
	}
	// The summary counts every claim, the one given back too.
	if sum.Batches != 3 || sum.Claimed != 30 || sum.Released != 10 {
		t.Errorf("summary %+v, want 3 batches, 30 claimed, 10 of them released", sum)
	}
}

// overrunTarget delivers everything; each Publish takes the time took
// gives it on the fake clock, and it notes every message it was given.
type overrunTarget struct {
	clock *fakeClock
	took  func(call int) time.Duration
	mu    sync.Mutex
	calls int
	seen  map[uuid.UUID]bool
}

func (o *overrunTarget) Publish(_ context.Context, msgs []*outboxtype.Message) []publish.Result {
	o.mu.Lock()
	o.calls++
	for _, m := range msgs {
		o.seen[m.ID] = true
	}
	took := o.took(o.calls)
	o.mu.Unlock()
	o.clock.advance(took)
	return publish.Fill(len(msgs), publish.Ok("ok"))
}

// A batch claimed ahead on the estimate of the batches before it, when the
// batch it follows overruns that estimate and leaves it no time to be
// published, is given back whole — unleased, no attempt charged, nothing
// archived — not started, and not left leased until the reaper.
func TestBatchClaimedAheadPastItsTimeIsReleased(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.enqueue(t, 1000, billingMsg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	deadline, _ := ctx.Deadline()
	// 5 s left on the engine's clock: batch 1 takes 0.2 s, so batch 3 is
	// claimed ahead while batch 2 publishes; batch 2 then takes 4.5 s,
	// leaving 0.3 s, inside the completion reserve.
	clock := &fakeClock{now: deadline.Add(-5 * time.Second)}
	target := &overrunTarget{clock: clock, seen: map[uuid.UUID]bool{}, took: func(call int) time.Duration {
		if call == 2 {
			return 4500 * time.Millisecond
		}
		return 200 * time.Millisecond
	}}
	store := &claimNotingStore{Store: f.store}
	pubs := map[string]publish.Publisher{f.table.Routes[0].Target.Key(): target, f.table.Routes[1].Target.Key(): f.payment}
	e, err := dispatch.New(dispatch.Config{BatchSize: 100, MaxBatches: 1000, SafetyMargin: 1500 * time.Millisecond,
		CompletionReserve: 500 * time.Millisecond, Lease: time.Minute, Clock: clock.Now}, store, f.table, pubs, nil)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := e.Run(ctx, dispatch.Request{WorkerID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	var unpublished []uuid.UUID
	for _, id := range store.claimed() {
		if !target.seen[id] {
			unpublished = append(unpublished, id)
		}
	}
	if len(unpublished) != 100 {
		t.Fatalf("%d messages claimed but not published (summary %+v), want batch 3's 100", len(unpublished), sum)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.pending WHERE id = ANY ($1) AND lease_token IS NULL AND attempt_count = 0`, unpublished); n != 100 {
		t.Errorf("%d of the 100 messages claimed ahead are back in the queue unleased with no attempt charged", n)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox.attempts WHERE message_id = ANY ($1)`, unpublished); n != 0 {
		t.Errorf("%d outcomes archived for messages that were never published", n)
	}
	if sum.StoppedBy != dispatch.StoppedDeadline || sum.Batches != 3 || sum.Delivered != 200 || sum.Released != 100 {
		t.Errorf("summary %+v, want a deadline stop after 3 batches: 200 delivered, 100 released", sum)
	}
}

// orderedClaims makes batch k's completion wait until the claim made ahead
// of it has returned. Each batch here comes from a claim made after the
// one before it was recorded, and has one claim made ahead of it while it
// publishes: that claim is the 2k-th.
type orderedClaims struct {
	dispatch.Store
	started, returned, completions atomic.Int32
}

func (c *orderedClaims) ClaimBatch(ctx context.Context, p lease.ClaimParams) ([]outboxtype.Message, error) {
	c.started.Add(1)
	defer c.returned.Add(1)
	return c.Store.ClaimBatch(ctx, p)
}

func (c *orderedClaims) CompleteBatch(ctx context.Context, workerID string, results []lease.Result) ([]lease.Completion, error) {
	k := c.completions.Add(1)
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(time.Millisecond) {
		if n := c.started.Load(); n >= 2*k && c.returned.Load() == n {
			break
		}
	}
	return c.Store.CompleteBatch(ctx, workerID, results)
}

// A hot key alone in the queue gets longer runs while they publish
// quickly: each run costs a completion and a claim, one after the other,
// before the key's next, and against a target that takes many messages a
// call those gaps weigh as much as calls. As soon as the batch holds
// another key, runs are back to OrderedRun, so that no key waits long
// behind another's run.
func TestALoneHotKeysRunsGrowAndOtherKeysEndIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	payment := func(key string) func(i int) outbox.Message {
		return func(i int) outbox.Message {
			return outbox.Message{Namespace: "payments", Topic: "captured", OrderingKey: key, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
		}
	}
	for _, tc := range []struct {
		name    string
		keys    []string
		perKey  int
		batches []int
	}{
		{"one key", []string{"acct-1"}, 700, []int{100, 200, 400}},
		{"two keys", []string{"acct-1", "acct-2"}, 300, []int{200, 200, 200}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			for _, key := range tc.keys {
				f.enqueue(t, tc.perKey, payment(key))
			}
			// What a batch's claim ahead finds decides whether its key is
			// alone, and it must look while the batch is leased: a claim
			// ahead that reached the database only after the batch's
			// completion (its goroutine scheduled late, on a loaded machine)
			// would rightly find the key's next run and keep the runs at 100
			// (batches of 100, 100, 200, 300). So each completion waits for
			// the claim made ahead of its batch (see orderedClaims).
			claims := &orderedClaims{Store: f.store}
			e, err := dispatch.New(dispatch.Config{BatchSize: 1000, MaxBatches: 100, OrderedRun: 100}, claims, f.table,
				map[string]publish.Publisher{f.table.Routes[0].Target.Key(): f.billing, f.table.Routes[1].Target.Key(): f.payment}, nil)
			if err != nil {
				t.Fatal(err)
			}
			// A run grows only while it publishes in under a second: on a
			// loaded machine under the race detector a run of 200 can take
			// longer, and the runs would rightly stop growing.
			e.SetLonerRunTime(time.Minute)
			sum, err := e.Run(ctx, dispatch.Request{WorkerID: "w"})
			if err != nil {
				t.Fatal(err)
			}
			if want := len(tc.keys) * tc.perKey; sum.Delivered != want {
				t.Fatalf("delivered %d, want %d", sum.Delivered, want)
			}
			if !slices.Equal(f.payment.batches, tc.batches) {
				t.Errorf("batches of %v messages, want %v", f.payment.batches, tc.batches)
			}
		})
	}
}
