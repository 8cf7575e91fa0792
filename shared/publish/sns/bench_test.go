package sns_test

import (
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// BenchmarkPublishLittlesLaw publishes 10,000 messages of about 512 bytes,
// in Publish calls of 1,000, to a fake SNS that takes 20ms per call, with 8
// calls in flight. By Little's law the throughput cannot exceed
// 10 entries × 8 calls / 0.020 s = 4,000 messages per second; it reports
// the rate reached, the bound, their ratio, and the calls in flight and
// connections the fake saw.
//
// Two things keep the ratio under 1. One is structural: a Publish of 1,000
// is 100 calls, which 8 at a time take 13 rounds where 12.5 would be ideal
// (a ceiling of 0.96). The other is each call's own CPU — mostly the SDK's
// query-protocol serializer and signer, ~0.3ms per 10-entry call — which on
// a small machine shared with the fake adds to every round. A ratio well
// under that means something serializes the calls: typically an HTTP
// connection pool with fewer idle connections per host than calls in flight
// ("connections" then exceeds 8).
//
//	go test -run '^$' -bench LittlesLaw -benchtime 3x ./shared/publish/sns
func BenchmarkPublishLittlesLaw(b *testing.B) {
	shape := publishtest.LittlesLaw{
		Messages: 10_000, PerPublish: 1_000, PayloadBytes: 512,
		Latency: 20 * time.Millisecond, Concurrency: 8, PerCall: 10,
	}
	bundle := setup(b, setupOptions{cfg: sns.Config{Concurrency: shape.Concurrency}})
	bundle.fake.SetLatency(shape.Latency)
	publishtest.BenchLittlesLaw(b, bundle.pub, shape)
	b.ReportMetric(float64(bundle.fake.MaxInFlight()), "max-in-flight")
	b.ReportMetric(float64(bundle.fake.Connections()), "connections")
}

// BenchmarkPublishOrderedRun publishes one ordering key's run of 100
// messages of about 512 bytes to a FIFO topic on the fake: 10 PublishBatch
// calls of 10, one after another, as a hot key's run goes out. It reports
// what each call took beyond the fake's latency — our encoding and
// serializer, the SDK's signer and deserializer, the loopback round trip,
// the fake's own parsing and answer and its timer — which a hot key pays
// once per call on top of SNS's latency (its calls cannot overlap). At
// latency 0 that is the calls' whole cost; at 20ms, as the hot-key
// benchmark's target answers, the fake's timer is in it too.
//
//	go test -run '^$' -bench OrderedRun -benchtime 100x ./shared/publish/sns
func BenchmarkPublishOrderedRun(b *testing.B) {
	const run, perCall = 100, 10
	for _, latency := range []time.Duration{0, 20 * time.Millisecond} {
		b.Run("latency="+latency.String(), func(b *testing.B) {
			bundle := setup(b, setupOptions{cfg: sns.Config{TopicARN: snsfake.TopicARN(fifoTopic)}})
			bundle.fake.SetLatency(latency)
			msgs := publishtest.OrderedMessages("hot", run, 512)
			for b.Loop() {
				for _, r := range bundle.pub.Publish(b.Context(), msgs) {
					if r.Kind != publish.Delivered {
						b.Fatalf("a message was not delivered: %s %v", r.Kind, r.Err)
					}
				}
			}
			calls := time.Duration(b.N * run / perCall)
			b.ReportMetric(float64((b.Elapsed()/calls - latency).Microseconds()), "µs-beyond-latency/call")
		})
	}
}
