package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/sink"
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
	orderKey  string
	seq       int64
	attempt   int32
	// outcome: outcomeNew (the handler ran and committed), outcomeDuplicate
	// (answered 200 duplicate), outcomeAborted (the sender gave up while a
	// concurrent duplicate held the id: no answer, nothing handled).
	outcome  atomic.Int32
	created  time.Time
	received time.Time
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
}

// Target is the webhook receiver the dispatchers deliver to: the reference
// receiver (shared/sink, signature verified, deduplicated on webhook-id)
// behind a fault injector, with a recorder between the two that keeps every
// delivery, duplicates included.
type Target struct {
	URL string

	faults   TargetFaults
	server   *http.Server
	listener net.Listener
	receiver http.Handler

	burstUntil atomic.Int64 // unix nanos; calls before it are throttled

	mu         sync.Mutex
	deliveries []*delivery

	calls, inj5xx, inj429, inj4xx, toHandled, toStalled, bursts, burstThrottled, rejected atomic.Int64
	// firstDeliveries counts the deliveries the handler ran for: one per
	// message (the deduper lets each webhook-id through once).
	firstDeliveries atomic.Int64
}

type callKey struct{}

// call carries what the fault injector decided and decoded to the recorder
// and the handler, through the request's context.
type call struct {
	env  publish.Envelope
	slow bool
	d    *delivery
}

// StartTarget starts the receiver on a free loopback port.
func StartTarget(secret []byte, faults TargetFaults) (*Target, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &Target{URL: "http://" + l.Addr().String() + "/hooks/outbox", faults: faults, listener: l}
	t.receiver = sink.NewReceiver(secret, &recordingDeduper{inner: sink.NewMemoryDeduper(), t: t}, t.handle,
		sink.WithLogger(discardLogger()))
	t.server = &http.Server{Handler: http.HandlerFunc(t.serve), ReadHeaderTimeout: 10 * time.Second}
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

func (t *Target) serve(w http.ResponseWriter, r *http.Request) {
	t.calls.Add(1)
	if time.Now().UnixNano() < t.burstUntil.Load() {
		t.burstThrottled.Add(1)
		w.Header().Set("Retry-After", strconv.Itoa(int(max(t.faults.RetryAfter, time.Second)/time.Second)))
		http.Error(w, `{"status":"retry","error":"throttled (burst)"}`, http.StatusTooManyRequests)
		return
	}
	u := rand.Float64()
	slow := false
	switch {
	case u < t.faults.TimeoutRate/2:
		// Stalled: never processed, never answered in time.
		t.toStalled.Add(1)
		select {
		case <-time.After(2 * t.faults.RouteTimeout):
		case <-r.Context().Done():
		}
		http.Error(w, "stalled", http.StatusServiceUnavailable)
		return
	case u < t.faults.TimeoutRate:
		// Processed, but answered after the sender gave up.
		t.toHandled.Add(1)
		slow = true
	case u < t.faults.TimeoutRate+t.faults.FailRate:
		t.injectFailure(w)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, sink.DefaultMaxBodyBytes+1))
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	c := &call{slow: slow}
	_ = json.Unmarshal(body, &c.env) // the receiver rejects what does not decode
	r = r.WithContext(context.WithValue(r.Context(), callKey{}, c))
	r.Body = io.NopCloser(bytes.NewReader(body))
	rw := &statusWriter{ResponseWriter: w}
	t.receiver.ServeHTTP(rw, r)
	if rw.status >= 400 && c.d == nil {
		t.rejected.Add(1) // the receiver refused it before deduplication (signature, envelope)
	}
}

func (t *Target) injectFailure(w http.ResponseWriter) {
	switch v := rand.Float64(); {
	case v < 0.5:
		t.inj5xx.Add(1)
		status := []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable}[rand.IntN(3)]
		http.Error(w, `{"status":"retry","error":"injected failure"}`, status)
	case v < 0.8:
		t.inj429.Add(1)
		w.Header().Set("Retry-After", strconv.Itoa(int(max(t.faults.RetryAfter, time.Second)/time.Second)))
		http.Error(w, `{"status":"retry","error":"injected throttle"}`, http.StatusTooManyRequests)
	default:
		t.inj4xx.Add(1)
		status := []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusUnprocessableEntity}[rand.IntN(4)]
		http.Error(w, `{"status":"rejected","error":"injected refusal"}`, status)
	}
}

// handle is the plugin author's handler: it accepts everything; a call
// picked to time out after processing sleeps past the route's timeout
// first, then commits.
func (t *Target) handle(ctx context.Context, _ publish.Envelope) error {
	if c, _ := ctx.Value(callKey{}).(*call); c != nil && c.slow {
		time.Sleep(2 * t.faults.RouteTimeout)
	}
	return nil
}

// recordingDeduper records every call that reaches deduplication, before
// the inner deduper answers, and then what it answered.
type recordingDeduper struct {
	inner sink.Deduper
	t     *Target
}

func (d *recordingDeduper) Begin(ctx context.Context, webhookID string) (context.Context, sink.Delivery, error) {
	c, _ := ctx.Value(callKey{}).(*call)
	var rec *delivery
	if c != nil {
		id, _ := uuid.Parse(c.env.ID)
		rec = &delivery{
			id: id, webhookID: webhookID, orderKey: c.env.OrderingKey, seq: c.env.SequenceID,
			attempt: int32(c.env.Attempt), created: c.env.CreatedAt,
		}
		c.d = rec
		d.t.mu.Lock()
		rec.received = time.Now()
		d.t.deliveries = append(d.t.deliveries, rec)
		d.t.mu.Unlock()
	}
	hctx, del, err := d.inner.Begin(ctx, webhookID)
	if rec != nil {
		switch {
		case errors.Is(err, sink.ErrDuplicate):
			rec.outcome.Store(outcomeDuplicate)
		case err != nil:
			rec.outcome.Store(outcomeAborted)
		default:
			rec.outcome.Store(outcomeNew)
			d.t.firstDeliveries.Add(1)
		}
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

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}
