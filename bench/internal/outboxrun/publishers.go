package outboxrun

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
)

// noopPublisher accepts every message at once: what is left is the cost of
// the outbox and the engine themselves.
type noopPublisher struct{}

var _ publish.Publisher = noopPublisher{}

func (noopPublisher) Publish(_ context.Context, msgs []*outboxtype.Message) []publish.Result {
	return publish.Fill(len(msgs), publish.Ok(""))
}

// latencyPublisher models a target whose every call takes a fixed latency:
// messages go PerCall to a call, Concurrency calls at a time, taken in order
// from a shared counter as the real publishers do (shared/publish/eventbridge).
type latencyPublisher struct {
	PerCall     int
	Concurrency int
	Latency     time.Duration
	calls       atomic.Int64
}

var _ publish.Publisher = (*latencyPublisher)(nil)

func (p *latencyPublisher) Publish(ctx context.Context, msgs []*outboxtype.Message) []publish.Result {
	results := make([]publish.Result, len(msgs))
	n := (len(msgs) + p.PerCall - 1) / p.PerCall
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(p.Concurrency, n) {
		wg.Go(func() {
			timer := time.NewTimer(0)
			<-timer.C
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				timer.Reset(p.Latency)
				select {
				case <-timer.C:
				case <-ctx.Done():
				}
				p.calls.Add(1)
				for j := i * p.PerCall; j < min((i+1)*p.PerCall, len(msgs)); j++ {
					results[j] = publish.Ok("")
				}
			}
		})
	}
	wg.Wait()
	return results
}
