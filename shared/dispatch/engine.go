// Package dispatch is the bounded run one dispatch invocation performs:
// claim a batch, route each message, publish each route's messages with
// bounded concurrency, record every outcome in one completion call, and
// repeat while batches come back full — until the queue is drained, the
// batch budget is spent, or the invocation's deadline is near.
//
//	claim (1 round trip) ─► route ─► publish per target, concurrently ─► complete (1 round trip)
//	      ▲                                                                      │
//	      └──────────────── while the batch was full, time and budget remain ────┘
//
// Time is the scarce resource of a Lambda invocation. The engine stops
// claiming when less than SafetyMargin remains before the deadline, gives the
// publishers only until CompletionReserve before it, and completes with the
// reserve, so that every message it claimed is completed exactly once — or,
// if the process dies, left leased for the reaper. The lease always outlasts
// the invocation (Config.Validate enforces it), so no other worker can take a
// message while this one may still complete it.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/retry"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/telemetry/redact"
	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
)

// Why a run stopped, as reported in Summary.StoppedBy.
const (
	StoppedDrained    = "drained"
	StoppedDeadline   = "deadline"
	StoppedMaxBatches = "max_batches"
)

// Store is the part of *lease.Store the engine uses.
type Store interface {
	ClaimBatch(ctx context.Context, p lease.ClaimParams) ([]lease.Message, error)
	CompleteBatch(ctx context.Context, workerID string, results []lease.Result) ([]lease.Completion, error)
}

var _ Store = (*lease.Store)(nil)

// Router finds a message's route; *route.Table is one.
type Router interface {
	Match(namespace, topic string) *route.Route
}

// Engine runs dispatch batches. Build one per cold start and reuse it.
type Engine struct {
	cfg        Config
	store      Store
	routes     Router
	publishers map[string]publish.Publisher
	log        *slog.Logger
	tracer     *tracing.Tracer
}

// SetTracer records a span around each claim, publish and completion
// (nil: none).
func (e *Engine) SetTracer(t *tracing.Tracer) { e.tracer = t }

// New returns an engine. publishers maps each route target's Key() to its
// publisher; a route whose target has none is a configuration error that
// New reports, so that it fails the cold start rather than a message.
func New(cfg Config, store Store, routes *route.Table, publishers map[string]publish.Publisher, log *slog.Logger) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, r := range routes.Routes {
		if publishers[r.Target.Key()] == nil {
			return nil, fmt.Errorf("dispatch: no publisher for %s (target %s)", r.Name, r.Target.Key())
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Engine{cfg: cfg, store: store, routes: routes, publishers: publishers, log: log}, nil
}

// Request is one invocation's parameters: the event's overrides applied to
// the configuration.
type Request struct {
	// WorkerID names this invocation in leases and attempts (required).
	WorkerID string
	// BatchSize, MaxBatches and Namespaces override the configuration when
	// set.
	BatchSize  int
	MaxBatches int
	Namespaces []string
	// Log, when set, is the invocation's logger (with its request id);
	// otherwise the engine's own.
	Log *slog.Logger
}

// Summary is a run's answer (DESIGN.md §4).
type Summary struct {
	WorkerID   string `json:"worker_id"`
	Batches    int    `json:"batches"`
	Claimed    int    `json:"claimed"`
	Delivered  int    `json:"delivered"`
	Retried    int    `json:"retried"`
	Dead       int    `json:"dead"`
	LeaseLost  int    `json:"lease_lost"`
	DurationMS int64  `json:"duration_ms"`
	StoppedBy  string `json:"stopped_by"`
	// Targets breaks the counts down by target type, for metrics.
	Targets map[string]*TargetStats `json:"-"`
}

// TargetStats are one target type's figures in a run.
type TargetStats struct {
	Delivered int
	Retried   int
	Dead      int
	// Latencies are the durations of the publish calls to this target type.
	Latencies []time.Duration
}

func (s *Summary) target(kind string) *TargetStats {
	if s.Targets == nil {
		s.Targets = map[string]*TargetStats{}
	}
	t := s.Targets[kind]
	if t == nil {
		t = &TargetStats{}
		s.Targets[kind] = t
	}
	return t
}

// Run performs one bounded run. It returns the summary of what was done
// even when it returns an error (a database failure mid-run); messages whose
// completion failed stay leased until the reaper requeues them.
func (e *Engine) Run(ctx context.Context, req Request) (sum Summary, err error) {
	start := e.cfg.Clock()
	sum.WorkerID = req.WorkerID
	// A named result, so that the duration reaches the caller on every path.
	defer func() { sum.DurationMS = e.cfg.Clock().Sub(start).Milliseconds() }()

	batchSize, maxBatches, namespaces := e.cfg.BatchSize, e.cfg.MaxBatches, e.cfg.Namespaces
	if req.BatchSize > 0 {
		batchSize = req.BatchSize
	}
	if req.MaxBatches > 0 {
		maxBatches = req.MaxBatches
	}
	if len(req.Namespaces) > 0 {
		namespaces = req.Namespaces
	}
	if req.WorkerID == "" {
		return sum, errors.New("dispatch: a worker id is required")
	}
	log := req.Log
	if log == nil {
		log = e.log
	}
	if deadline, ok := ctx.Deadline(); ok {
		// The lease must outlast everything this invocation may still do.
		if left := deadline.Sub(start); left+e.cfg.SafetyMargin > e.cfg.Lease {
			return sum, fmt.Errorf("dispatch: the invocation has %s left but the lease is %s: raise OUTBOX_LEASE above the function timeout plus the %s safety margin",
				left.Round(time.Millisecond), e.cfg.Lease, e.cfg.SafetyMargin)
		}
	}

	claim := func() ([]lease.Message, error) {
		claimCtx, span := e.tracer.Start(ctx, "claim")
		msgs, err := e.store.ClaimBatch(claimCtx, lease.ClaimParams{
			WorkerID: req.WorkerID, BatchSize: batchSize, Lease: e.cfg.Lease, Namespaces: namespaces,
		})
		span.SetAttribute("claimed", len(msgs))
		span.End(err)
		if err != nil {
			return nil, fmt.Errorf("dispatch: claim: %w", err)
		}
		return msgs, nil
	}
	// mayClaim says whether a batch whose publishing starts after waitFor
	// may be claimed, or why not: it must start with the safety margin
	// still ahead of the deadline.
	mayClaim := func(waitFor time.Duration) (bool, string) {
		switch deadline, ok := ctx.Deadline(); {
		case sum.Batches >= maxBatches:
			return false, StoppedMaxBatches
		case ok && deadline.Sub(e.cfg.Clock())-waitFor < e.cfg.SafetyMargin, ctx.Err() != nil:
			return false, StoppedDeadline
		}
		return true, ""
	}
	// slowestPublish is the longest a batch's publishing has taken in this
	// run. A batch claimed ahead is published only after the current one,
	// so it is claimed only if the margin would still be left then, by this
	// estimate; otherwise it would start short of time and its calls be cut
	// off by the completion reserve, answered by the target but recorded as
	// retries.
	var slowestPublish time.Duration

	// The run is a pipeline: while batch n is published, batch n-1 is
	// completed and batch n+1 claimed, so that the two database round trips
	// hide behind the target's latency instead of adding to it. At most two
	// batches are leased at once; the safety margin is checked before every
	// claim, for the time the claimed batch will start publishing. Under a
	// deadline, the first batch's successor is claimed only after the first
	// is published: until then there is no publishing time to go by.
	var completing chan batchDone // batch n-1's completion, while n publishes
	settle := func() error {
		if completing == nil {
			return nil
		}
		done := <-completing
		completing = nil
		sum.merge(&done.part)
		return done.err
	}
	finish := func(stoppedBy string, err error) (Summary, error) {
		if settleErr := settle(); err == nil {
			err = settleErr
		}
		if err == nil {
			sum.StoppedBy = stoppedBy
		}
		return sum, err
	}

	if ok, why := mayClaim(0); !ok {
		return finish(why, nil)
	}
	msgs, err := claim()
	for {
		if err != nil {
			return finish("", err)
		}
		if len(msgs) == 0 {
			return finish(StoppedDrained, nil)
		}
		sum.Batches++
		sum.Claimed += len(msgs)

		stoppedBy := StoppedDrained // a short batch drained the queue
		var ahead chan claimResult
		claimAfter := false
		if len(msgs) == batchSize {
			var ok bool
			if _, timed := ctx.Deadline(); timed && sum.Batches == 1 {
				// No publishing measured yet to tell whether a batch claimed
				// now would start in time: claim the next one after this one
				// is published.
				claimAfter = true
			} else if ok, stoppedBy = mayClaim(slowestPublish); ok {
				ahead = make(chan claimResult, 1)
				go func() {
					next, err := claim()
					ahead <- claimResult{next, err}
				}()
			}
		}

		publishing := e.cfg.Clock()
		items := e.publishBatch(ctx, msgs)
		slowestPublish = max(slowestPublish, e.cfg.Clock().Sub(publishing))
		if err := settle(); err != nil {
			// The previous completion failed (the database went away): still
			// try to record what was just published, then stop. A batch
			// claimed ahead stays leased until the reaper requeues it.
			var part Summary
			if cerr := e.complete(ctx, log, req.WorkerID, items, &part); cerr == nil {
				sum.merge(&part)
			}
			return sum, err
		}
		completing = make(chan batchDone, 1)
		go func() {
			var part Summary
			err := e.complete(ctx, log, req.WorkerID, items, &part)
			completing <- batchDone{part: part, err: err}
		}()

		if claimAfter {
			if ok, why := mayClaim(0); !ok {
				return finish(why, nil)
			}
			msgs, err = claim()
			continue
		}
		if ahead == nil {
			return finish(stoppedBy, nil)
		}
		next := <-ahead
		msgs, err = next.msgs, next.err
	}
}

type claimResult struct {
	msgs []lease.Message
	err  error
}

type batchDone struct {
	part Summary
	err  error
}

// merge adds a batch's figures to the run's.
func (s *Summary) merge(part *Summary) {
	s.Delivered += part.Delivered
	s.Retried += part.Retried
	s.Dead += part.Dead
	s.LeaseLost += part.LeaseLost
	for kind, ts := range part.Targets {
		into := s.target(kind)
		into.Delivered += ts.Delivered
		into.Retried += ts.Retried
		into.Dead += ts.Dead
		into.Latencies = append(into.Latencies, ts.Latencies...)
	}
}

// pending is one claimed message on its way through a batch.
type pending struct {
	msg    *lease.Message
	route  *route.Route
	result publish.Result
	// latency is the duration of the publish call that carried it.
	latency time.Duration
}

// publishBatch routes the claimed messages and publishes them; every item
// comes back with its result.
func (e *Engine) publishBatch(ctx context.Context, msgs []lease.Message) []pending {
	items := make([]pending, len(msgs))
	groups := map[string][]int{} // target key → indexes into items, in claim order
	var order []string
	for i := range msgs {
		it := &items[i]
		it.msg = &msgs[i]
		it.route = e.routes.Match(it.msg.Namespace, it.msg.Topic)
		switch {
		case it.route == nil:
			it.result = publish.Fail(publish.CodeNoRoute, fmt.Errorf("no route matches namespace %q topic %q", it.msg.Namespace, it.msg.Topic))
			continue
		case len(it.msg.Payload) > it.route.MaxPayloadBytes:
			it.result = publish.Fail(publish.CodePayloadTooLarge, fmt.Errorf("payload is %d bytes, over %s's max_payload_bytes of %d", len(it.msg.Payload), it.route.Name, it.route.MaxPayloadBytes))
			continue
		}
		if err := it.route.CheckPayload(it.msg.Payload); err != nil {
			it.result = publish.Fail(publish.CodeInvalidPayload, fmt.Errorf("payload fails %s's schema: %w", it.route.Name, err))
			continue
		}
		key := it.route.Target.Key()
		if _, seen := groups[key]; !seen {
			order = append(order, key)
		}
		groups[key] = append(groups[key], i)
	}

	e.publishGroups(ctx, items, groups, order)
	return items
}

// publishGroups publishes each target's messages, several targets at once.
// Publishers get the invocation's time minus the completion reserve.
func (e *Engine) publishGroups(ctx context.Context, items []pending, groups map[string][]int, order []string) {
	if len(order) == 0 {
		return
	}
	publishCtx := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		publishCtx, cancel = context.WithDeadline(ctx, deadline.Add(-e.cfg.CompletionReserve))
		defer cancel()
	}
	sem := make(chan struct{}, e.cfg.TargetConcurrency)
	var wg sync.WaitGroup
	for _, key := range order {
		idx := groups[key]
		publisher := e.publishers[key]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			batch := make([]*lease.Message, len(idx))
			for j, i := range idx {
				batch[j] = items[i].msg
			}
			spanCtx, span := e.tracer.Start(publishCtx, "publish")
			span.SetAttribute("target_type", items[idx[0]].route.Target.Type)
			span.SetAttribute("route", items[idx[0]].route.Name)
			span.SetAttribute("messages", len(batch))
			started := e.cfg.Clock()
			results := publishSafely(spanCtx, publisher, batch)
			took := e.cfg.Clock().Sub(started)
			span.End(nil)
			for j, i := range idx {
				items[i].result = results[j]
				items[i].latency = took
			}
		}()
	}
	wg.Wait()
}

// publishSafely holds a publisher to its contract: exactly one result per
// message. A publisher that panics or miscounts gets every message retried
// rather than one lost or misattributed.
func publishSafely(ctx context.Context, p publish.Publisher, batch []*lease.Message) (results []publish.Result) {
	defer func() {
		if r := recover(); r != nil {
			results = publish.Fill(len(batch), publish.Retry(publish.CodeTarget5xx, fmt.Errorf("publisher panicked: %v", r), 0))
		}
	}()
	results = p.Publish(ctx, batch)
	if len(results) != len(batch) {
		return publish.Fill(len(batch), publish.Retry(publish.CodeTarget5xx,
			fmt.Errorf("publisher returned %d results for %d messages", len(results), len(batch)), 0))
	}
	for i, r := range results {
		if r.Kind != publish.Delivered && r.Kind != publish.Retryable && r.Kind != publish.Terminal {
			results[i] = publish.Retry(publish.CodeTarget5xx, fmt.Errorf("publisher returned no outcome"), 0)
		}
	}
	return results
}

// complete turns publish results into outcomes and records them all in one
// call.
func (e *Engine) complete(ctx context.Context, log *slog.Logger, workerID string, items []pending, sum *Summary) error {
	now := e.cfg.Clock()
	results := make([]lease.Result, len(items))
	for i := range items {
		results[i] = e.outcome(&items[i], now)
	}

	// The completion may use the reserve the publishers were denied, but not
	// more: past the deadline the function is frozen or killed anyway.
	completeCtx := context.WithoutCancel(ctx)
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		completeCtx, cancel = context.WithDeadline(completeCtx, deadline)
		defer cancel()
	}
	completeCtx, span := e.tracer.Start(completeCtx, "complete")
	span.SetAttribute("messages", len(results))
	completions, err := e.completeWithRetry(completeCtx, log, workerID, results)
	span.End(err)
	if err != nil {
		if errors.Is(err, lease.ErrDoubleDispatch) {
			log.Error("double-delivery backstop fired: a message was already recorded as dispatched; the whole batch was rolled back",
				"worker_id", workerID, "messages", len(results), "error", err.Error())
		}
		return fmt.Errorf("dispatch: complete %d messages: %w", len(results), err)
	}

	for i, c := range completions {
		it := &items[i]
		kind := "none"
		if it.route != nil {
			kind = it.route.Target.Type
		}
		ts := sum.target(kind)
		if it.route != nil && it.result.Kind != 0 && it.latency > 0 {
			ts.Latencies = append(ts.Latencies, it.latency)
		}
		switch {
		case c.Status == lease.StatusLeaseLost:
			sum.LeaseLost++
			log.Warn("lease lost: the message was not ours to complete any more; another worker has it",
				"message_id", it.msg.ID.String(), "attempt", it.msg.Attempt)
		case c.Status == lease.StatusDead || results[i].Outcome == lease.Failed:
			sum.Dead++
			ts.Dead++
			log.Error("message dead-lettered",
				"message_id", it.msg.ID.String(), "namespace", it.msg.Namespace, "topic", it.msg.Topic,
				"attempt", it.msg.Attempt, "code", results[i].ErrorCode, "error", results[i].ErrorMessage)
		case results[i].Outcome == lease.Retryable:
			sum.Retried++
			ts.Retried++
		default:
			sum.Delivered++
			ts.Delivered++
		}
	}
	return nil
}

// completeWithRetry retries a completion whose connection failed before the
// database answered. Repeating it is safe: rows the first attempt completed
// come back lease_lost, never completed twice.
func (e *Engine) completeWithRetry(ctx context.Context, log *slog.Logger, workerID string, results []lease.Result) ([]lease.Completion, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var completions []lease.Completion
		completions, err = e.store.CompleteBatch(ctx, workerID, results)
		if err == nil {
			return completions, nil
		}
		var classified *lease.Error
		if errors.As(err, &classified) && classified.Kind != nil {
			return nil, err // the database refused it: repeating cannot help
		}
		if ctx.Err() != nil {
			return nil, err
		}
		log.Warn("completion failed; retrying", "worker_id", workerID, "attempt", attempt+1, "error", err.Error())
		select {
		case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		case <-ctx.Done():
			return nil, err
		}
	}
	return nil, err
}

// outcome maps one publish result to the outcome the database records,
// applying the route's retry policy.
func (e *Engine) outcome(it *pending, now time.Time) lease.Result {
	m := it.msg
	r := lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Latency: it.latency}
	if it.route != nil {
		r.Target = it.route.Name
	}
	res := it.result
	switch res.Kind {
	case publish.Delivered:
		r.Outcome = lease.Dispatched
		r.TargetRef = res.TargetRef
		return r
	case publish.Retryable:
		r.ErrorCode, r.ErrorMessage = string(res.Code), errorText(res.Err)
		policy := retry.Default
		if it.route != nil {
			policy = it.route.Retry
		}
		at, err := policy.Next(now, m.Attempt, res.RetryAfter, e.cfg.Jitter)
		if errors.Is(err, retry.ErrExhausted) {
			r.Outcome = lease.Failed
			r.ErrorMessage = fmt.Sprintf("retries exhausted after attempt %d of %d: %s", m.Attempt, policy.MaxAttempts, r.ErrorMessage)
			return r
		}
		r.Outcome = lease.Retryable
		r.RetryAt = at
		return r
	default:
		r.Outcome = lease.Failed
		r.ErrorCode, r.ErrorMessage = string(res.Code), errorText(res.Err)
		return r
	}
}

// errorText is what the attempts archive and the dead letters record: the
// error with any connection string or credential masked, since operators
// read it and it is kept for the retention window.
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return redact.Error(err)
}
