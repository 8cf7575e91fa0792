package publishtest

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
)

// LittlesLaw is the shape of a Little's-law benchmark: Messages of
// PayloadBytes published PerPublish at a time to a target that answers
// every call after Latency, with Concurrency calls in flight and PerCall
// messages per call.
type LittlesLaw struct {
	Messages, PerPublish, PayloadBytes int
	Latency                            time.Duration
	Concurrency, PerCall               int
}

// Bound is Little's law for the target: at most PerCall × Concurrency
// messages per Latency.
func (s LittlesLaw) Bound() float64 {
	return float64(s.PerCall*s.Concurrency) / s.Latency.Seconds()
}

// Ceiling is the best rate any publisher reaches on this shape: Publish
// returns when its last call does, and a Publish of PerPublish is
// ceil(PerPublish / PerCall) calls that take whole rounds of Concurrency
// (1,000 messages in calls of 10 on 8 workers: 13 rounds, not 12.5, 96% of
// the bound).
func (s LittlesLaw) Ceiling() float64 {
	calls := (s.PerPublish + s.PerCall - 1) / s.PerCall
	rounds := (calls + s.Concurrency - 1) / s.Concurrency
	return float64(s.PerPublish) / (time.Duration(rounds) * s.Latency).Seconds()
}

// BenchLittlesLaw publishes s.Messages through p, s.PerPublish at a time,
// and reports the rate reached ("msgs/s"), the bound and the ceiling of
// its shape, and rate/bound ("of-bound"). Anything per call or per message
// that the publisher adds beyond the latency — a lost connection, a
// serialised step, an idle worker — shows as a ratio below the ceiling's.
// p must be wired to a double that answers after s.Latency; it is warmed
// with one round of calls first, so that its connections are open as a
// warm function's are.
func BenchLittlesLaw(b *testing.B, p publish.Publisher, s LittlesLaw) {
	b.Helper()
	msgs := Messages(s.Messages, s.PayloadBytes)
	deliver := func(ctx context.Context, batch []*outboxtype.Message, offset int) {
		for i, r := range p.Publish(ctx, batch) {
			if r.Kind != publish.Delivered {
				b.Fatalf("message %d: %s %s %v", offset+i, r.Kind, r.Code, r.Err)
			}
		}
	}
	ctx := context.Background()
	deliver(ctx, msgs[:min(s.PerCall*s.Concurrency, len(msgs))], 0)

	b.ReportAllocs()
	for b.Loop() {
		for off := 0; off < s.Messages; off += s.PerPublish {
			deliver(ctx, msgs[off:min(off+s.PerPublish, s.Messages)], off)
		}
	}
	rate := float64(b.N*s.Messages) / b.Elapsed().Seconds()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(s.Bound(), "bound-msgs/s")
	b.ReportMetric(s.Ceiling(), "ceiling-msgs/s")
	b.ReportMetric(rate/s.Bound(), "of-bound")
}
