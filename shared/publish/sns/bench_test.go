package sns_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/publishtest"
	"github.com/outboxkit/dispatcher/shared/publish/sns"
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
	const (
		total       = 10_000
		perPublish  = 1_000
		payload     = 512
		latency     = 20 * time.Millisecond
		concurrency = 8
		perCall     = 10
	)
	bundle := setup(b, setupOptions{cfg: sns.Config{Concurrency: concurrency}})
	bundle.fake.SetLatency(latency)
	msgs := publishtest.Messages(total, payload)
	ctx := context.Background()
	publishAll := func(batch int) {
		for off := 0; off < total; off += batch {
			for i, r := range bundle.pub.Publish(ctx, msgs[off:off+batch]) {
				if r.Kind != publish.Delivered {
					b.Fatalf("message %d: %s %s %v", off+i, r.Kind, r.Code, r.Err)
				}
			}
		}
	}
	// Open the connections before timing, as a warm function has them.
	for i, r := range bundle.pub.Publish(ctx, msgs[:perCall*concurrency]) {
		if r.Kind != publish.Delivered {
			b.Fatalf("warm-up message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
		}
	}

	b.ResetTimer()
	for b.Loop() {
		publishAll(perPublish)
	}
	rate := float64(b.N*total) / b.Elapsed().Seconds()
	bound := perCall * concurrency / latency.Seconds()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(bound, "bound-msgs/s")
	b.ReportMetric(rate/bound, "of-bound")
	b.ReportMetric(float64(bundle.fake.MaxInFlight()), "max-in-flight")
	b.ReportMetric(float64(bundle.fake.Connections()), "connections")
}
