package soak

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/sink"
	"github.com/outboxkit/dispatcher/shared/sink/faultsink"
)

// TargetFaults say how the webhook target misbehaves.
type TargetFaults struct {
	// FailRate is the share of calls answered with an injected failure:
	// half 5xx (500, 502, 503), three tenths 429 with Retry-After, one
	// fifth a terminal 4xx (400, 404, 409, 422).
	FailRate float64
	// TimeoutRate is the share of calls not answered within RouteTimeout:
	// half are processed (the handler runs and commits) and answered late,
	// half stall and are never processed.
	TimeoutRate float64
	// RouteTimeout is the dispatch route's timeout; a timed-out call takes
	// twice as long.
	RouteTimeout time.Duration
	// RetryAfter is sent with the injected 429s.
	RetryAfter time.Duration
}

// delivery is one call that reached the receiver's deduplication step:
// signature verified and envelope decoded, recorded before the deduper
// decides whether it is a duplicate.
type delivery struct {
	id        uuid.UUID
	webhookID string
	topic     string
	orderKey  string
	seq       int64
	attempt   int32
	// outcome: outcomeNew (the handler ran and committed), outcomeDuplicate
	// (answered 200 duplicate), outcomeAborted (the sender gave up while a
	// concurrent duplicate held the id: no answer, nothing handled).
	outcome  atomic.Int32
	created  time.Time
	received time.Time
	// arrived is when the call's request reached the target, before any
	// injected hold: what a pause's window is checked against.
	arrived time.Time
}

const (
	outcomePending int32 = iota
	outcomeNew
	outcomeDuplicate
	outcomeAborted
)

// TargetCounts are what the target did, by kind of answer.
type TargetCounts struct {
	Calls           int64 `json:"calls"`
	Injected5xx     int64 `json:"injected_5xx"`
	Injected429     int64 `json:"injected_429"`
	Injected4xx     int64 `json:"injected_terminal_4xx"`
	TimeoutsHandled int64 `json:"timeouts_processed_late"`
	TimeoutsStalled int64 `json:"timeouts_stalled"`
	Bursts          int64 `json:"throttle_bursts"`
	BurstThrottled  int64 `json:"burst_throttled_calls"`
	BadSignature    int64 `json:"rejected_by_receiver"`
	Deliveries      int64 `json:"deliveries"`
	Duplicates      int64 `json:"duplicates_answered"`
	StuckRefused    int64 `json:"stuck_key_refused_calls"`
}

// Target is the webhook receiver the dispatchers deliver to: the reference
// receiver (shared/sink, signature verified, deduplicated on webhook-id)
// behind the fault injector the demo uses too (shared/sink/faultsink), with
// a recorder around the deduper that keeps every delivery, duplicates
// included.
type Target struct {
	URL string

	faults   TargetFaults
	server   *http.Server
	listener net.Listener

	burstUntil atomic.Int64 // unix nanos; calls before it are throttled

	// stuck is the ordering key whose calls all fail with a 503 while it
	// is set (a stuck key: its head keeps failing while the others flow).
	stuck        atomic.Pointer[string]
	stuckRefused atomic.Int64

	mu         sync.Mutex
	deliveries []*delivery

	calls, inj5xx, inj429, inj4xx, toHandled, toStalled, bursts, burstThrottled, rejected atomic.Int64
	// firstDeliveries counts the deliveries the handler ran for: one per
	// message (the deduper lets each webhook-id through once).
	firstDeliveries atomic.Int64
}

// StartTarget starts the receiver on a free loopback port.
func StartTarget(secret []byte, faults TargetFaults) (*Target, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &Target{URL: "http://" + l.Addr().String() + "/hooks/outbox", faults: faults, listener: l}
	// The plugin author's handler accepts everything; the late ones are
	// made late by the fault injector, which holds them before it runs.
	accept := func(context.Context, publish.Envelope) error { return nil }
	receiver := faultsink.New(secret, &recordingDeduper{inner: sink.NewMemoryDeduper(), t: t}, accept,
		faultsink.Config{Pick: t.pick, StallFor: 2 * faults.RouteTimeout, Observe: t.observe},
		sink.WithLogger(discardLogger()))
	t.server = &http.Server{Handler: receiver, ReadHeaderTimeout: 10 * time.Second}
	go t.server.Serve(l)
	return t, nil
}

// Close stops accepting calls and waits (bounded) for those in progress,
// slow handlers included, so that every delivery is recorded.
func (t *Target) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = t.server.Shutdown(ctx)
}

// Burst throttles every call for d.
func (t *Target) Burst(d time.Duration) {
	t.bursts.Add(1)
	t.burstUntil.Store(time.Now().Add(d).UnixNano())
}

// Stick makes every call for an ordering key fail until Unstick.
func (t *Target) Stick(key string) { t.stuck.Store(&key) }

// Unstick lets the stuck key's calls through again.
func (t *Target) Unstick() { t.stuck.Store(nil) }

// pick draws each call's fault at the configured rates, and counts it.
func (t *Target) pick(c faultsink.Call) faultsink.Fault {
	t.calls.Add(1)
	retryAfter := max(t.faults.RetryAfter, time.Second)
	if key := t.stuck.Load(); key != nil && c.Envelope.OrderingKey == *key {
		t.stuckRefused.Add(1)
		return faultsink.Fault{Kind: faultsink.Fail, Status: http.StatusServiceUnavailable, Reason: "stuck key"}
	}
	if time.Now().UnixNano() < t.burstUntil.Load() {
		t.burstThrottled.Add(1)
		return faultsink.Fault{Kind: faultsink.Throttle, RetryAfter: retryAfter, Reason: "throttled (burst)"}
	}
	switch u := rand.Float64(); {
	case u < t.faults.TimeoutRate/2:
		t.toStalled.Add(1)
		return faultsink.Fault{Kind: faultsink.Stall}
	case u < t.faults.TimeoutRate:
		t.toHandled.Add(1)
		return faultsink.Fault{Kind: faultsink.HandleLate}
	case u < t.faults.TimeoutRate+t.faults.FailRate:
		switch v := rand.Float64(); {
		case v < 0.5:
			t.inj5xx.Add(1)
			status := []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable}[rand.IntN(3)]
			return faultsink.Fault{Kind: faultsink.Fail, Status: status, Reason: "injected failure"}
		case v < 0.8:
			t.inj429.Add(1)
			return faultsink.Fault{Kind: faultsink.Throttle, RetryAfter: retryAfter, Reason: "injected throttle"}
		default:
			t.inj4xx.Add(1)
			status := []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusUnprocessableEntity}[rand.IntN(4)]
			return faultsink.Fault{Kind: faultsink.Fail, Status: status, Reason: "injected refusal"}
		}
	}
	return faultsink.Fault{}
}

// observe counts the calls the receiver refused before deduplication
// (signature, envelope): the handler refuses nothing, so every 4xx the
// receiver itself answered is one.
func (t *Target) observe(o faultsink.Outcome) {
	switch o.Fault.Kind {
	case faultsink.Pass, faultsink.HandleLate:
		if o.Status >= 400 && o.Status < 500 {
			t.rejected.Add(1)
		}
	}
}

// recordingDeduper records every call that reaches deduplication, before
// the inner deduper answers, and then what it answered.
type recordingDeduper struct {
	inner sink.Deduper
	t     *Target
}

func (d *recordingDeduper) Begin(ctx context.Context, webhookID string) (context.Context, sink.Delivery, error) {
	c, _ := faultsink.CallFrom(ctx)
	env := c.Envelope
	id, _ := uuid.Parse(env.ID)
	rec := &delivery{
		id: id, webhookID: webhookID, topic: env.Topic, orderKey: env.OrderingKey, seq: env.SequenceID,
		attempt: int32(env.Attempt), created: env.CreatedAt, arrived: c.Received,
	}
	d.t.mu.Lock()
	rec.received = time.Now()
	d.t.deliveries = append(d.t.deliveries, rec)
	d.t.mu.Unlock()
	hctx, del, err := d.inner.Begin(ctx, webhookID)
	switch {
	case errors.Is(err, sink.ErrDuplicate):
		rec.outcome.Store(outcomeDuplicate)
	case err != nil:
		rec.outcome.Store(outcomeAborted)
	default:
		rec.outcome.Store(outcomeNew)
		d.t.firstDeliveries.Add(1)
	}
	return hctx, del, err
}

// Deliveries returns the recorded deliveries in arrival order.
func (t *Target) Deliveries() []*delivery {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*delivery(nil), t.deliveries...)
}

// DeliveredCount is the number of recorded deliveries so far (cheap).
func (t *Target) DeliveredCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.deliveries)
}

// Counts returns the target's counters.
func (t *Target) Counts() TargetCounts {
	c := TargetCounts{
		Calls: t.calls.Load(), Injected5xx: t.inj5xx.Load(), Injected429: t.inj429.Load(), Injected4xx: t.inj4xx.Load(),
		TimeoutsHandled: t.toHandled.Load(), TimeoutsStalled: t.toStalled.Load(), Bursts: t.bursts.Load(),
		BurstThrottled: t.burstThrottled.Load(), BadSignature: t.rejected.Load(),
		StuckRefused: t.stuckRefused.Load(),
	}
	for _, d := range t.Deliveries() {
		switch d.outcome.Load() {
		case outcomeNew:
			c.Deliveries++
		case outcomeDuplicate:
			c.Deliveries++
			c.Duplicates++
		}
	}
	return c
}
