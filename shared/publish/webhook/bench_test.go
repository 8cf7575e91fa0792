package webhook

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
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
	shape := publishtest.LittlesLaw{
		Messages: 10_000, PerPublish: 1_000, PayloadBytes: 512,
		Latency: 20 * time.Millisecond, Concurrency: 8, PerCall: 1,
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(shape.Latency)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	p := newTestPublisher(b, srv.URL, func(c *Config) { c.Concurrency = shape.Concurrency })
	publishtest.BenchLittlesLaw(b, p, shape)
}
