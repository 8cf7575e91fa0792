package proposal

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/route"
)

// PipelineConfig is one pipelined run.
type PipelineConfig struct {
	WorkerID   string
	BatchSize  int
	Lease      time.Duration
	Routes     *route.Table
	Publishers map[string]publish.Publisher
	// TargetConcurrency bounds the targets published to at once, as
	// dispatch.Config.TargetConcurrency.
	TargetConcurrency int
}

// RunPipelined drains the queue as repeated dispatch.Engine runs do —
// claim, route, publish per target, complete — with one change: while a
// batch is being published, the connection completes the previous batch and
// claims the next one. A batch's cost is then the longer of its publishing
// and one claim plus one completion, not their sum; with a target whose
// latency dominates, the database round trips disappear from the rate.
//
// It is a measuring prototype of the change, not a replacement engine: it
// has no deadline handling (the engine's safety margin would have to cover
// the batch claimed ahead), no retry policy (a retryable result is due
// again at once) and no tracing. It returns the messages delivered.
func RunPipelined(ctx context.Context, store dispatch.Store, cfg PipelineConfig) (int, error) {
	claim := func() ([]lease.Message, error) {
		return store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: cfg.WorkerID, BatchSize: cfg.BatchSize, Lease: cfg.Lease})
	}
	delivered := 0
	complete := func(results []lease.Result) error {
		cs, err := store.CompleteBatch(ctx, cfg.WorkerID, results)
		if err != nil {
			return err
		}
		for i, c := range cs {
			if c.Status == lease.StatusOK && results[i].Outcome == lease.Dispatched {
				delivered++
			}
		}
		return nil
	}

	msgs, err := claim()
	if err != nil {
		return 0, err
	}
	var previous []lease.Result
	for len(msgs) > 0 {
		published := make(chan []lease.Result, 1)
		go func(msgs []lease.Message) { published <- publishBatch(ctx, cfg, msgs) }(msgs)
		if previous != nil {
			if err := complete(previous); err != nil {
				<-published
				return delivered, fmt.Errorf("pipeline: complete: %w", err)
			}
		}
		var next []lease.Message
		if len(msgs) == cfg.BatchSize {
			if next, err = claim(); err != nil {
				<-published
				return delivered, fmt.Errorf("pipeline: claim: %w", err)
			}
		}
		previous = <-published
		msgs = next
	}
	if previous != nil {
		if err := complete(previous); err != nil {
			return delivered, fmt.Errorf("pipeline: complete: %w", err)
		}
	}
	return delivered, nil
}

// publishBatch routes msgs, publishes each target's share with at most
// TargetConcurrency targets at once, and turns the results into outcomes.
func publishBatch(ctx context.Context, cfg PipelineConfig, msgs []lease.Message) []lease.Result {
	results := make([]lease.Result, len(msgs))
	groups := map[string][]int{}
	var order []string
	for i := range msgs {
		m := &msgs[i]
		results[i] = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken}
		r := cfg.Routes.Match(m.Namespace, m.Topic)
		if r == nil {
			results[i].Outcome, results[i].ErrorCode = lease.Failed, string(publish.CodeNoRoute)
			continue
		}
		results[i].Target = r.Name
		key := r.Target.Key()
		if _, ok := groups[key]; !ok {
			order = append(order, key)
		}
		groups[key] = append(groups[key], i)
	}
	sem := make(chan struct{}, max(cfg.TargetConcurrency, 1))
	var wg sync.WaitGroup
	for _, key := range order {
		idx := groups[key]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			batch := make([]*lease.Message, len(idx))
			for j, i := range idx {
				batch[j] = &msgs[i]
			}
			started := time.Now()
			rs := cfg.Publishers[key].Publish(ctx, batch)
			took := time.Since(started)
			for j, i := range idx {
				res := &results[i]
				res.Latency = took
				switch r := rs[j]; r.Kind {
				case publish.Delivered:
					res.Outcome, res.TargetRef = lease.Dispatched, r.TargetRef
				case publish.Retryable:
					res.Outcome, res.ErrorCode = lease.Retryable, string(r.Code)
				default:
					res.Outcome, res.ErrorCode = lease.Failed, string(r.Code)
				}
			}
		})
	}
	wg.Wait()
	return results
}
