// Package dispatch is the bounded run one dispatch invocation performs:
// claim a batch, route each message, publish each route's messages with
// bounded concurrency, record every outcome in one completion call, and
// repeat while claims return work — until the queue is drained, the batch
// budget is spent, or the invocation's deadline is near.
//
//	claim (1 round trip) ─► route ─► publish per target, concurrently ─► complete (1 round trip)
//	      ▲                                                                      │
//	      └──────────── while claims return work, time and budget remain ────────┘
//
// Consecutive batches overlap: while one batch is published, the next is
// claimed and the previous one's completion recorded, so that the two round
// trips hide behind the targets' latency (pipeline.go lays the steps out).
//
// # Ordered runs
//
// A claim hands out, per ordering key, a run: the key's head and up to
// OrderedRun-1 of the messages queued behind it, in sequence order. The
// publishers deliver each run strictly in that order (per-message targets
// one call after another, SNS FIFO topics in ordered batches), different
// keys in parallel; at the first message of a run that is not delivered,
// the rest of the run is released untouched (no attempt charged, nothing
// archived) so that nothing of the key overtakes it. A run also stops where
// its messages would go to another target, or where one cannot be sent at
// all (no route, too large, failing the route's schema): what follows waits
// for the next claim, which the database hands out only once this run is
// recorded (one claim in flight per key).
//
// A claim that comes back short does not end the run: a queue of a few hot
// keys yields one run per key per claim, and the next runs of those keys
// are claimable as soon as the current ones are recorded. The run ends when
// a claim made after every earlier completion comes back empty.
//
// A hot key alone in the queue gets longer runs: while its runs are cut at
// the run length, no other work turns up and a run publishes in under a
// second, each claim doubles the run, up to the batch size; anything else in
// a batch brings it back to OrderedRun (pipeline.adaptRun says why).
//
// # Time
//
// Time is the scarce resource of a Lambda invocation. The engine stops
// claiming when less than SafetyMargin remains before the deadline, gives the
// publishers only until CompletionReserve before it, and completes with the
// reserve, so that every message it claimed is completed exactly once — or,
// if the process dies, left leased until its lease expires, when the next
// claim takes it over. Each claim's lease is the invocation's time left plus
// the safety margin, so no other worker can take a message while this one
// may still complete it, and a killed invocation's messages wait no longer
// than its deadline plus the margin. A batch the run claimed but
// will not publish (time ran out, or the database failed under it) is
// released, not left to expire.
//
// # Memory
//
// A claim is bounded by BatchBytes of payload as well as by BatchSize
// messages, and never loads a payload larger than the largest any route may
// send: such a message comes back without it and is dead-lettered as
// PAYLOAD_TOO_LARGE without a call. So a producer's 100 MB payload costs the
// function nothing.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/telemetry/redact"
	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
	"golang.org/x/sync/errgroup"
)

// Why a run stopped, as reported in Summary.StoppedBy.
const (
	StoppedDrained    = "drained"
	StoppedDeadline   = "deadline"
	StoppedMaxBatches = "max_batches"
)

// Store is the part of *lease.Store the engine uses.
type Store interface {
	ClaimBatch(ctx context.Context, p lease.ClaimParams) ([]outboxtype.Message, error)
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
	// maxPayload is the largest payload any route may send: a claim never
	// loads a larger one.
	maxPayload int
	// gates are the targets' circuit breakers and rate limits (none: the
	// run never asks gate), from the routes.
	gates map[string]targetGate
	gate  Gater
	// lonerRunTime is lonerRunTime, apart so that a test of the runs'
	// growth does not depend on how fast its machine publishes.
	lonerRunTime time.Duration
}

// SetTracer records a span around each claim, publish and completion
// (nil: none).
func (e *Engine) SetTracer(t *tracing.Tracer) { e.tracer = t }

// New returns an engine. publishers maps each route target's Key() to its
// publisher; a route whose target has none is a configuration error that
// New reports, so that it fails the cold start rather than a message.
func New(cfg Config, store Store, routes *route.Table, publishers map[string]publish.Publisher, log *slog.Logger) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	maxPayload := 0
	for _, r := range routes.Routes {
		if publishers[r.Target.Key()] == nil {
			return nil, fmt.Errorf("dispatch: no publisher for %s (target %s)", r.Name, r.Target.Key())
		}
		maxPayload = max(maxPayload, r.MaxPayloadBytes)
	}
	gates, err := targetGates(routes.Routes)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Engine{cfg: cfg, store: store, routes: routes, publishers: publishers, log: log, maxPayload: maxPayload,
		gates: gates, lonerRunTime: lonerRunTime}, nil
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

// Summary is a run's answer, the dispatch function's JSON summary.
type Summary struct {
	WorkerID  string `json:"worker_id"`
	Batches   int    `json:"batches"`
	Claimed   int    `json:"claimed"`
	Delivered int    `json:"delivered"`
	Retried   int    `json:"retried"`
	Dead      int    `json:"dead"`
	LeaseLost int    `json:"lease_lost"`
	// Released counts messages given back untouched: the rest of an
	// ordered run after a message that was not delivered, and batches the
	// run claimed but did not publish.
	Released int `json:"released"`
	// Held counts the retries (among Retried) of messages held for a
	// configuration failure: access denied, a missing target or route.
	Held int `json:"held"`
	// Gated counts the messages (among Released) given back by their
	// target's circuit breaker or rate limit, no attempt spent.
	Gated      int    `json:"-"`
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
	// Latencies are the durations of the calls that carried each message
	// (a batch call's duration for each of its messages).
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

// Add adds another run's figures to s (not its duration or why it
// stopped): an invocation that runs the engine several times answers
// their sum.
func (s *Summary) Add(run Summary) {
	s.Batches += run.Batches
	s.Claimed += run.Claimed
	s.merge(&run)
}

// merge adds a batch's figures to the run's.
func (s *Summary) merge(part *Summary) {
	s.Delivered += part.Delivered
	s.Retried += part.Retried
	s.Dead += part.Dead
	s.LeaseLost += part.LeaseLost
	s.Released += part.Released
	s.Held += part.Held
	s.Gated += part.Gated
	for kind, ts := range part.Targets {
		into := s.target(kind)
		into.Delivered += ts.Delivered
		into.Retried += ts.Retried
		into.Dead += ts.Dead
		into.Latencies = append(into.Latencies, ts.Latencies...)
	}
}

// Run performs one bounded run. It returns the summary of what was done
// even when it returns an error (a database failure mid-run); messages whose
// completion failed stay leased until the reaper requeues them, and batches
// claimed but not yet published are released.
func (e *Engine) Run(ctx context.Context, req Request) (sum Summary, err error) {
	start := e.cfg.Clock()
	sum.WorkerID = req.WorkerID
	// A named result, so that the duration reaches the caller on every path.
	defer func() { sum.DurationMS = e.cfg.Clock().Sub(start).Milliseconds() }()

	if req.WorkerID == "" {
		return sum, errors.New("dispatch: a worker id is required")
	}
	if len(e.gates) > 0 && e.gate == nil {
		return sum, errors.New("dispatch: routes have circuit breakers or rate limits, but the engine has no gate store (SetGate)")
	}
	p := &pipeline{e: e, ctx: ctx, sum: &sum, workerID: req.WorkerID,
		batchSize: e.cfg.BatchSize, maxBatches: e.cfg.MaxBatches, namespaces: e.cfg.Namespaces, log: req.Log}
	if req.BatchSize > 0 {
		p.batchSize = req.BatchSize
	}
	if req.MaxBatches > 0 {
		p.maxBatches = req.MaxBatches
	}
	if len(req.Namespaces) > 0 {
		p.namespaces = req.Namespaces
	}
	if p.log == nil {
		p.log = e.log
	}
	p.run = min(e.cfg.OrderedRun, p.batchSize)
	return sum, p.loop()
}

// claimLease is the lease of a claim made now. Under a deadline it is the
// time left plus the safety margin: nothing of this invocation runs past its
// deadline (Lambda stops the process there), so the lease cannot expire
// under work still in hand — the margin covers the claim's round trip and
// any skew between this clock and the database's — and the messages of an
// invocation that is killed are claimable by the next claim SafetyMargin
// after its deadline. A lease of the function timeout plus a minute, as
// it was, kept them from everyone for up to two minutes longer than that.
// Without a deadline (outboxctl serve) it is Config.Lease.
func (e *Engine) claimLease(ctx context.Context) time.Duration {
	deadline, ok := ctx.Deadline()
	if !ok {
		return e.cfg.Lease
	}
	// The database counts a lease in whole seconds; round up, never down.
	return max(deadline.Sub(e.cfg.Clock())+e.cfg.SafetyMargin, time.Second)
}

// completionContext is what a completion may use: the reserve the
// publishers were denied, but not more (past the deadline the function is
// frozen or killed anyway), and a few seconds outside Lambda.
func (e *Engine) completionContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = e.cfg.Clock().Add(e.cfg.SafetyMargin)
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

// pending is one claimed message on its way through a batch.
type pending struct {
	msg    *outboxtype.Message
	route  *route.Route
	result publish.Result
	// retryAt is when a message a gate held is due again.
	retryAt time.Time
}

// orderingKey names an ordering key; keys are scoped by namespace.
type orderingKey struct{ namespace, key string }

// routedBatch is a claimed batch after the route step: every message with
// its route, or already with its result when it will not be sent, and the
// messages to send grouped by target.
type routedBatch struct {
	items  []pending
	groups map[string][]int // target key → indexes into items, in claim order
	order  []string         // the target keys, in order of first appearance
}

// routeBatch is the route step: it matches each claimed message to its
// route, answers at once those that cannot be sent (see refuse) and those
// of an ordered run that must wait, and groups the rest by target. The
// store returns each ordering key's run together and in sequence order.
func (e *Engine) routeBatch(msgs []outboxtype.Message) routedBatch {
	items := make([]pending, len(msgs))
	groups := map[string][]int{}
	var order []string
	// runTarget is the target of each key's run so far; a key is absent
	// once its run has stopped.
	runTarget := map[orderingKey]string{}
	stopped := map[orderingKey]bool{}
	for i := range msgs {
		it := &items[i]
		it.msg = &msgs[i]
		m := it.msg
		k := orderingKey{m.Namespace, m.OrderingKey}
		ordered := m.OrderingKey != ""
		if ordered && stopped[k] {
			it.result = released
			continue
		}
		it.route = e.routes.Match(m.Namespace, m.Topic)
		if refused, ok := e.refuse(m, it.route); ok {
			it.result = refused
			stopped[k] = ordered
			continue
		}
		target := it.route.Target.Key()
		if ordered {
			if first, seen := runTarget[k]; seen && first != target {
				// A run goes to one target at a time: the rest waits for
				// the next claim, so that it cannot overtake what this
				// batch still has in flight to the first target.
				it.result = released
				stopped[k] = true
				continue
			}
			runTarget[k] = target
		}
		if _, seen := groups[target]; !seen {
			order = append(order, target)
		}
		groups[target] = append(groups[target], i)
	}
	return routedBatch{items: items, groups: groups, order: order}
}

// released is the result of a message not sent because an earlier message
// of its key was not (or will not be) delivered in this batch.
var released = publish.Result{Kind: publish.Released}

// refuse returns the terminal result of a message that cannot be sent at
// all, without a call.
func (e *Engine) refuse(m *outboxtype.Message, rt *route.Route) (publish.Result, bool) {
	switch {
	case m.DecodeError != nil:
		return publish.Fail(outboxtype.CodeInvalidMessage, fmt.Errorf("the stored message cannot be decoded: %w", m.DecodeError)), true
	case rt == nil:
		return publish.Fail(outboxtype.CodeNoRoute, fmt.Errorf("no route matches namespace %q topic %q", m.Namespace, m.Topic)), true
	case m.PayloadOmitted():
		return publish.Fail(outboxtype.CodePayloadTooLarge, fmt.Errorf("payload is %d bytes, over the %d that the largest route may send; it was never loaded", m.PayloadBytes, e.maxPayload)), true
	case len(m.Payload) > rt.MaxPayloadBytes:
		return publish.Fail(outboxtype.CodePayloadTooLarge, fmt.Errorf("payload is %d bytes, over %s's max_payload_bytes of %d", len(m.Payload), rt.Name, rt.MaxPayloadBytes)), true
	}
	if err := rt.CheckPayload(m.Payload); err != nil {
		return publish.Fail(outboxtype.CodeInvalidPayload, fmt.Errorf("payload fails %s's schema: %w", rt.Name, err)), true
	}
	return publish.Result{}, false
}

// publishBatch is the publish step: each target's messages go to its
// publisher, several targets at once, and every item gets its result.
// Publishers get until the earlier of the invocation's deadline minus the
// completion reserve and the batch's lease expiry minus the safety margin:
// a call still running when the lease runs out would deliver a message that
// another worker may already be delivering.
func (e *Engine) publishBatch(ctx context.Context, b routedBatch) {
	if len(b.order) == 0 {
		return
	}
	items := b.items
	publishCtx, cancel := context.WithDeadline(ctx, e.publishDeadline(ctx, items))
	defer cancel()
	var targets errgroup.Group
	targets.SetLimit(e.cfg.TargetConcurrency)
	for _, key := range b.order {
		idx := b.groups[key]
		publisher := e.publishers[key]
		targets.Go(func() error {
			batch := make([]*outboxtype.Message, len(idx))
			for j, i := range idx {
				batch[j] = items[i].msg
			}
			spanCtx, span := e.tracer.Start(publishCtx, "publish")
			span.SetAttribute("target_type", items[idx[0]].route.Target.Type)
			span.SetAttribute("route", items[idx[0]].route.Name)
			span.SetAttribute("messages", len(batch))
			results := publishSafely(spanCtx, publisher, batch)
			span.End(nil)
			for j, i := range idx {
				items[i].result = results[j]
			}
			return nil
		})
	}
	_ = targets.Wait() // the publishers answer in their results, never with an error
}

// publishDeadline is when a batch's publishing must stop (see
// publishBatch).
func (e *Engine) publishDeadline(ctx context.Context, items []pending) time.Time {
	var until time.Time
	for i := range items {
		if t := items[i].msg.LeaseExpiresAt.Add(-e.cfg.SafetyMargin); until.IsZero() || t.Before(until) {
			until = t
		}
	}
	if deadline, ok := ctx.Deadline(); ok {
		if t := deadline.Add(-e.cfg.CompletionReserve); until.IsZero() || t.Before(until) {
			until = t
		}
	}
	return until
}

// publishSafely holds a publisher to its contract: exactly one result per
// message. A publisher that panics or miscounts gets every message retried
// rather than one lost or misattributed; an ordered run then keeps only its
// first message as a retry and releases the rest, as if it had failed there.
func publishSafely(ctx context.Context, p publish.Publisher, batch []*outboxtype.Message) (results []publish.Result) {
	broken := func(err error) []publish.Result {
		out := make([]publish.Result, len(batch))
		first := map[orderingKey]bool{}
		for i, m := range batch {
			k := orderingKey{m.Namespace, m.OrderingKey}
			if m.OrderingKey != "" && first[k] {
				out[i] = released
				continue
			}
			first[k] = true
			out[i] = publish.Retry(outboxtype.CodeTarget5xx, err, 0)
		}
		return out
	}
	defer func() {
		if r := recover(); r != nil {
			results = broken(fmt.Errorf("publisher panicked: %v", r))
		}
	}()
	results = p.Publish(ctx, batch)
	if len(results) != len(batch) {
		return broken(fmt.Errorf("publisher returned %d results for %d messages", len(results), len(batch)))
	}
	for i, r := range results {
		switch r.Kind {
		case publish.Delivered, publish.Retryable, publish.Terminal, publish.Released:
		default:
			results[i] = publish.Retry(outboxtype.CodeTarget5xx, fmt.Errorf("publisher returned no outcome"), 0)
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

	completeCtx, cancel := e.completionContext(ctx)
	defer cancel()
	completeCtx, span := e.tracer.Start(completeCtx, "complete")
	span.SetAttribute("messages", len(results))
	completions, err := e.completeWithRetry(completeCtx, log, workerID, results)
	span.End(err)
	if err != nil {
		return fmt.Errorf("dispatch: complete %d messages: %w", len(results), err)
	}

	for i, c := range completions {
		it := &items[i]
		kind := "none"
		if it.route != nil {
			kind = it.route.Target.Type
		}
		ts := sum.target(kind)
		if it.result.Latency > 0 {
			ts.Latencies = append(ts.Latencies, it.result.Latency)
		}
		switch {
		case c.Status == outboxtype.StatusLeaseLost:
			sum.LeaseLost++
			log.Warn("lease lost: the message was not ours to complete any more; another worker has it",
				"message_id", it.msg.ID.String(), "attempt", it.msg.Attempt)
		case c.Status == outboxtype.StatusDead || results[i].Outcome == outboxtype.OutcomeFailed:
			sum.Dead++
			ts.Dead++
			log.Error("message dead-lettered",
				"message_id", it.msg.ID.String(), "namespace", it.msg.Namespace, "topic", it.msg.Topic,
				"attempt", it.msg.Attempt, "code", results[i].ErrorCode, "error", results[i].ErrorMessage)
		case results[i].Outcome == outboxtype.OutcomeReleased:
			sum.Released++
		case results[i].Outcome == outboxtype.OutcomeRetryable:
			sum.Retried++
			ts.Retried++
			if results[i].Hold {
				sum.Held++
				log.Warn("message held: the target is misconfigured, not the message; it is retried until that is fixed",
					"message_id", it.msg.ID.String(), "namespace", it.msg.Namespace, "topic", it.msg.Topic,
					"attempt", it.msg.Attempt, "code", results[i].ErrorCode, "error", results[i].ErrorMessage)
			}
		default:
			if c.Status == outboxtype.StatusDoubleDispatch {
				log.Error("double-delivery backstop fired: the message was already recorded as dispatched, and was delivered again",
					"message_id", it.msg.ID.String(), "namespace", it.msg.Namespace, "topic", it.msg.Topic, "attempt", it.msg.Attempt)
			}
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
	r := lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Latency: it.result.Latency}
	if it.route != nil {
		r.Target = it.route.Name
		if m.OrderingKey != "" {
			r.OnDead = outboxtype.OnDead(it.route.OnDead)
		}
	}
	res := it.result
	if (res.Kind == publish.Terminal || res.Kind == publish.Retryable) && configurationFailure[res.Code] &&
		(it.route == nil || it.route.OnConfigError != route.OnConfigErrorDead) {
		policy := backoff.Default
		if it.route != nil {
			policy = it.route.Retry
		}
		r.Outcome, r.Hold = outboxtype.OutcomeRetryable, true
		r.ErrorCode, r.ErrorMessage = string(res.Code), errorText(res.Err)
		r.RetryAt = policy.Hold(now, m.Attempt, HoldMinDelay, HoldMaxDelay, e.cfg.Jitter)
		return r
	}
	switch res.Kind {
	case publish.Delivered:
		r.Outcome = outboxtype.OutcomeDispatched
		r.TargetRef = res.TargetRef
		return r
	case publish.Released:
		r.Outcome = outboxtype.OutcomeReleased
		r.RetryAt = it.retryAt
		return r
	case publish.Retryable:
		r.ErrorCode, r.ErrorMessage = string(res.Code), errorText(res.Err)
		policy := backoff.Default
		if it.route != nil {
			policy = it.route.Retry
		}
		at, err := policy.Next(now, m.Attempt, res.RetryAfter, e.cfg.Jitter)
		if errors.Is(err, backoff.ErrExhausted) {
			r.Outcome = outboxtype.OutcomeFailed
			r.ErrorMessage = fmt.Sprintf("retries exhausted after attempt %d of %d: %s", m.Attempt, policy.MaxAttempts, r.ErrorMessage)
			return r
		}
		r.Outcome = outboxtype.OutcomeRetryable
		r.RetryAt = at
		return r
	default:
		r.Outcome = outboxtype.OutcomeFailed
		r.ErrorCode, r.ErrorMessage = string(res.Code), errorText(res.Err)
		return r
	}
}

// configurationFailure are the codes of a failure that is the
// deployment's, not the message's: fixing the configuration (a policy, a
// topic, a route) is what delivers the message, so it is held (retried
// without end, with a capped backoff) rather than dead-lettered, unless its
// route says on_config_error: dead. Dead-lettering every message of a
// route for an IAM mistake would turn one typo into a bulk replay, and let
// an ordered key's later messages overtake.
var configurationFailure = map[outboxtype.Code]bool{
	outboxtype.CodeAccessDenied:   true,
	outboxtype.CodeTargetNotFound: true,
	outboxtype.CodeNoRoute:        true,
}

// HoldMinDelay and HoldMaxDelay bound the backoff of a message held for a
// configuration failure. Nobody fixes a policy or a route within seconds,
// so even the first retry waits 30 s to a minute (the run that held the
// message does not claim it again, whatever its route's base_delay); once
// the configuration is fixed, held messages go within HoldMaxDelay.
const (
	HoldMinDelay = time.Minute
	HoldMaxDelay = 5 * time.Minute
)

// errorText is what the attempts archive and the dead letters record: the
// error with any connection string or credential masked, since operators
// read it and it is kept for the retention window.
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return redact.Error(err)
}
