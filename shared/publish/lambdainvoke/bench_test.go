package lambdainvoke

import (
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/publishtest"
)

// BenchmarkPublishLittlesLaw measures delivered messages per second through
// the real SDK client against the wire fake answering every invocation
// after a fixed 20 ms, and compares it with Little's law: one message per
// invocation, so with Concurrency invocations in flight the bound is
// 1 × Concurrency / latency (8 / 20 ms = 400 msgs/s), not the 10× of a
// batching target.
//
//	go test -run '^$' -bench BenchmarkPublishLittlesLaw -benchtime 1x ./shared/publish/lambdainvoke/
func BenchmarkPublishLittlesLaw(b *testing.B) {
	const (
		latency      = 20 * time.Millisecond
		concurrency  = 8
		messages     = 10_000
		perCall      = 1_000
		payloadBytes = 512
	)
	p, fake := newTestPublisher(b, ok(`{"status":"ok"}`), func(c *Config) { c.Concurrency = concurrency })
	fake.SetLatency(latency)
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
