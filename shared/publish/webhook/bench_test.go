package webhook

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
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

// BenchmarkRequestCPU is the publisher's own CPU for one message before
// the network: its body (Prepare), the signature and the header, in the
// envelope and as a CloudEvent in binary mode, for a 300-byte payload.
//
//	go test -run '^$' -bench BenchmarkRequestCPU -benchmem ./shared/publish/webhook/
func BenchmarkRequestCPU(b *testing.B) {
	events, err := cloudevent.New("")
	if err != nil {
		b.Fatal(err)
	}
	for name, configure := range map[string]func(*Config){
		"envelope":    nil,
		"cloudevents": func(c *Config) { c.CloudEvents = events },
	} {
		b.Run(name, func(b *testing.B) {
			p := newTestPublisher(b, "http://127.0.0.1:9/hook", configure)
			m := publishtest.Message(0, 300)
			m.OrderingKey, m.SequenceID = "account-7", 42
			now := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				body, _, refused := p.batcher.Prepare(m)
				if refused != nil {
					b.Fatal(refused.Err)
				}
				key := m.StableKey()
				_ = p.header(m, key, now, p.signer.Sign(key, now, body))
			}
		})
	}
}
