package lambdainvoke

import (
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
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
	shape := publishtest.LittlesLaw{
		Messages: 10_000, PerPublish: 1_000, PayloadBytes: 512,
		Latency: 20 * time.Millisecond, Concurrency: 8, PerCall: 1,
	}
	p, fake := newTestPublisher(b, ok(`{"status":"ok"}`), func(c *Config) { c.Concurrency = shape.Concurrency })
	fake.SetLatency(shape.Latency)
	publishtest.BenchLittlesLaw(b, p, shape)
}
