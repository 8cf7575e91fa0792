package workload

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"maps"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/sink"
)

// Target is a webhook endpoint that answers every call after a fixed
// latency and records when each message first arrived. Behind the
// latency is the reference receiver (shared/sink): the Standard Webhooks
// signature is verified and deliveries are deduplicated on the webhook-id,
// as a real receiver would.
type Target struct {
	// URL is where to deliver.
	URL string
	// Secret is the signing secret the route must use ("whsec_…").
	Secret string

	latency  time.Duration
	server   *http.Server
	receiver http.Handler

	mu       sync.Mutex
	receipts map[uuid.UUID]time.Time

	calls, duplicates, refused atomic.Int64
}

type arrivalKey struct{}

// StartTarget serves a target on a free loopback port that answers each
// call latency after it arrived.
func StartTarget(latency time.Duration) (*Target, error) {
	key := make([]byte, 32)
	rand.Read(key)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &Target{
		URL: "http://" + l.Addr().String() + "/events", Secret: "whsec_" + base64.StdEncoding.EncodeToString(key),
		latency: latency, receipts: map[uuid.UUID]time.Time{},
	}
	t.receiver = sink.NewReceiver(key, sink.NewMemoryDeduper(), t.handle)
	t.server = &http.Server{Handler: http.HandlerFunc(t.serve), ReadHeaderTimeout: 10 * time.Second}
	go t.server.Serve(l)
	return t, nil
}

func (t *Target) serve(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	t.calls.Add(1)
	if wait := time.Until(arrived.Add(t.latency)); wait > 0 {
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
			return
		}
	}
	rec := &statusRecorder{ResponseWriter: w}
	t.receiver.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), arrivalKey{}, arrived)))
	switch {
	case rec.Header().Get(sink.DuplicateHeader) == "true":
		t.duplicates.Add(1)
	case rec.status >= 300:
		t.refused.Add(1)
	}
}

// handle records a message's first delivery, at its arrival.
func (t *Target) handle(ctx context.Context, env publish.Envelope) error {
	id, err := uuid.Parse(env.ID)
	if err != nil {
		return sink.Reject(http.StatusUnprocessableEntity, errors.New("the envelope's id is not a message id"))
	}
	arrived, _ := ctx.Value(arrivalKey{}).(time.Time)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, seen := t.receipts[id]; !seen {
		t.receipts[id] = arrived
	}
	return nil
}

// Received is the number of distinct messages received so far.
func (t *Target) Received() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.receipts)
}

// Receipts is a copy of each message's first arrival, by message id.
func (t *Target) Receipts() map[uuid.UUID]time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.receipts)
}

// TargetCounts are the calls the target answered.
type TargetCounts struct {
	// Calls counts every request; Duplicates those answered as already
	// handled; Refused those answered with an error (a bad signature, …).
	Calls, Duplicates, Refused int64
}

// Counts are the target's call counts so far.
func (t *Target) Counts() TargetCounts {
	return TargetCounts{Calls: t.calls.Load(), Duplicates: t.duplicates.Load(), Refused: t.refused.Load()}
}

// Close stops the server.
func (t *Target) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return t.server.Shutdown(ctx)
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}
