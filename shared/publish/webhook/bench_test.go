package webhook

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/publishtest"
)

// BenchmarkPublishLittlesLaw measures delivered messages per second against
// a receiver that takes a fixed 20 ms per request, and compares it with
// Little's law: a webhook carries one message per request, so with
// Concurrency requests in flight the bound is 1 × Concurrency / latency
// (8 / 20 ms = 400 msgs/s), not the 10× of a batching target. The ratio
// is what the publisher's own overhead leaves of it.
//
//	go test -run '^$' -bench BenchmarkPublishLittlesLaw -benchtime 1x ./shared/publish/webhook/
func BenchmarkPublishLittlesLaw(b *testing.B) {
	const (
		latency      = 20 * time.Millisecond
		concurrency  = 8
		messages     = 10_000
		perCall      = 1_000
		payloadBytes = 512
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(latency)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	p := newTestPublisher(b, srv.URL, func(c *Config) { c.Concurrency = concurrency })
	calls := make([][]*lease.Message, messages/perCall)
	for i := range calls {
		calls[i] = publishtest.Messages(perCall, payloadBytes)
	}

	start := time.Now()
	for b.Loop() {
		for _, msgs := range calls {
			for i, r := range p.Publish(b.Context(), msgs) {
				if r.Kind != publish.Delivered {
					b.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
				}
			}
		}
	}
	elapsed := time.Since(start)

	rate := float64(b.N*messages) / elapsed.Seconds()
	bound := 1 * concurrency / latency.Seconds()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(bound, "bound-msgs/s")
	b.ReportMetric(100*rate/bound, "%-of-bound")
}
