package publish

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/outboxkit/dispatcher/shared/lease"
)

// EachConcurrently is the fan-out of per-message targets (webhooks, Lambda
// plugins): it calls one for every message, at most concurrency at once, and
// returns the results in the messages' order. A panic in one call (a bug)
// becomes a retryable result for that message alone, instead of taking the
// process — and every lease of the batch — with it.
func EachConcurrently(ctx context.Context, msgs []*lease.Message, concurrency int, one func(context.Context, *lease.Message) Result) []Result {
	results := make([]Result, len(msgs))
	safe := func(i int) {
		defer func() {
			if v := recover(); v != nil {
				results[i] = Retry(CodeTarget5xx, fmt.Errorf("panic while publishing: %v", v), 0)
			}
		}()
		results[i] = one(ctx, msgs[i])
	}
	workers := min(concurrency, len(msgs))
	if workers <= 1 {
		for i := range msgs {
			safe(i)
		}
		return results
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(msgs) {
					return
				}
				safe(i)
			}
		})
	}
	wg.Wait()
	return results
}
