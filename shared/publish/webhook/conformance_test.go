package webhook

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/sink"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// sinkDouble is a real receiver (shared/sink: the signature is verified
// with the Standard Webhooks library on every delivery) with the suite's
// failure injection in its handler.
type sinkDouble struct {
	mu       sync.Mutex
	calls    [][]uuid.UUID // every request's message, before the receiver judges it
	received []uuid.UUID
	fail     map[uuid.UUID]bool // id → terminal
	requests atomic.Int64
	stalled  atomic.Bool
}

func (d *sinkDouble) handle(_ context.Context, env publish.Envelope) error {
	id, err := publishtest.MessageID(env.Payload)
	if err != nil {
		return sink.Reject(http.StatusBadRequest, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if terminal, ok := d.fail[id]; ok {
		if terminal {
			return sink.Reject(http.StatusUnprocessableEntity, errors.New("the suite refuses this message"))
		}
		return errors.New("the suite fails this message for now")
	}
	d.received = append(d.received, id)
	return nil
}

func TestConformance(t *testing.T) {
	t.Parallel()
	publishtest.Run(t, func(t *testing.T) *publishtest.Target {
		double := &sinkDouble{fail: map[uuid.UUID]bool{}}
		receiver := sink.NewReceiver(testSecret, sink.NewMemoryDeduper(), double.handle,
			sink.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		closing := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			double.requests.Add(1)
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if id, err := publishtest.EnvelopeMessageID(body); err == nil {
				double.mu.Lock()
				double.calls = append(double.calls, []uuid.UUID{id})
				double.mu.Unlock()
			}
			if double.stalled.Load() {
				select {
				case <-r.Context().Done():
				case <-closing:
				}
				return
			}
			receiver.ServeHTTP(w, r)
		}))
		t.Cleanup(func() { close(closing); srv.Close() })

		const maxPayload = 8 << 10
		p := newTestPublisher(t, srv.URL, func(c *Config) { c.MaxPayloadBytes = maxPayload })
		return &publishtest.Target{
			Publisher:       p,
			MaxPayloadBytes: maxPayload,
			Received: func() []uuid.UUID {
				double.mu.Lock()
				defer double.mu.Unlock()
				return append([]uuid.UUID(nil), double.received...)
			},
			Calls: func() [][]uuid.UUID {
				double.mu.Lock()
				defer double.mu.Unlock()
				return append([][]uuid.UUID(nil), double.calls...)
			},
			Requests: func() int { return int(double.requests.Load()) },
			Fail: func(id uuid.UUID, terminal bool) {
				double.mu.Lock()
				defer double.mu.Unlock()
				double.fail[id] = terminal
			},
			Stall: func() { double.stalled.Store(true) },
		}
	})
}
