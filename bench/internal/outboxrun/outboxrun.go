// Package outboxrun measures this project: the producer's enqueue rate, the
// dispatch engine's burn-down rate with a no-op target, with a target of
// fixed latency and with ordering keys (one hot key to a real webhook or SNS
// FIFO publisher, or many keys), and how the claim, the producer's
// transaction and a dispatch invocation scale.
package outboxrun

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/bench/internal/latency"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/route"
)

// EnqueueBatchSize is the producer's batch in the enqueue figure.
const EnqueueBatchSize = 1000

// Namespace and Topic of every benchmark message.
const (
	Namespace = "billing"
	Topic     = "usage_snapshot"
)

// routesJSON is the route table of the burn-down runs: one catch-all route.
// Its target is never called: the engine gets an in-process publisher for
// the route's target key.
const routesJSON = `{"routes":[{"match":{"namespace":"*","topic":"*"},
  "target":{"type":"eventbridge","event_bus":"bench"}}]}`

// EnqueueResult is the enqueue figure.
type EnqueueResult struct {
	Messages int
	Elapsed  time.Duration
	// DedupeKeys says whether every message carried a dedupe key.
	DedupeKeys bool
}

// Rate is messages per second.
func (r EnqueueResult) Rate() float64 { return float64(r.Messages) / r.Elapsed.Seconds() }

// Enqueue writes spec.Messages messages with outbox.EnqueueBatch, in
// batches of EnqueueBatchSize on one connection, each batch its own
// transaction, and times it.
func Enqueue(ctx context.Context, db *scratch.DB, spec workload.Spec, dedupeKeys bool) (EnqueueResult, error) {
	return enqueue(ctx, db, spec, dedupeKeys, 0)
}

// EnqueueKeyed is Enqueue with ordering keys: message i goes to key
// "key-<i mod keys>", so the keys' messages are interleaved as the producers
// of that many keys would write them (one key when keys is 1). Every
// message carries a dedupe key, as Enqueue's dedupe-keyed workload does.
func EnqueueKeyed(ctx context.Context, db *scratch.DB, spec workload.Spec, keys int) (EnqueueResult, error) {
	return enqueue(ctx, db, spec, true, keys)
}

func enqueue(ctx context.Context, db *scratch.DB, spec workload.Spec, dedupeKeys bool, keys int) (EnqueueResult, error) {
	pool, err := db.Pool(ctx, 1)
	if err != nil {
		return EnqueueResult{}, err
	}
	defer pool.Close()
	payload := workload.Payload(spec.PayloadBytes)
	batches := make([][]outbox.Message, 0, spec.Messages/EnqueueBatchSize+1)
	for from := 0; from < spec.Messages; from += EnqueueBatchSize {
		batch := make([]outbox.Message, 0, EnqueueBatchSize)
		for i := from; i < min(spec.Messages, from+EnqueueBatchSize); i++ {
			m := outbox.Message{Namespace: Namespace, Topic: Topic, TenantID: fmt.Sprintf("tenant-%d", i%16), Payload: payload}
			if dedupeKeys {
				m.DedupeKey = fmt.Sprintf("tenant-%d/turn-%d/req-1", i%16, i)
			}
			if keys > 0 {
				m.OrderingKey = fmt.Sprintf("key-%d", i%keys)
			}
			batch = append(batch, m)
		}
		batches = append(batches, batch)
	}
	// Warm the connection and the prepared statement outside the timing.
	if err := pool.Ping(ctx); err != nil {
		return EnqueueResult{}, err
	}
	start := time.Now()
	for _, b := range batches {
		if _, err := outbox.EnqueueBatch(ctx, pool, b); err != nil {
			return EnqueueResult{}, err
		}
	}
	return EnqueueResult{Messages: spec.Messages, Elapsed: time.Since(start), DedupeKeys: dedupeKeys}, nil
}

// BurnDownResult is one burn-down run through the engine.
type BurnDownResult struct {
	Options  BurnDownOptions
	Messages int
	Elapsed  time.Duration
	// Claim and Complete are the time the two database calls held their
	// dispatcher's connection, summed over dispatchers; ClaimLatency and
	// CompleteLatency summarise those times for full batches. A call's time
	// runs from sending the statement to the last row decoded, as a pgx
	// query tracer sees it: with the pipelined engine a claim may wait for
	// the connection while the previous completion holds it, and that wait
	// is not the call's.
	Claim, Complete               time.Duration
	ClaimLatency, CompleteLatency latency.Summary
	// IntervalLatency summarises the time between the ends of two
	// successive full-batch completions of one dispatcher: what a batch
	// costs in the steady state, whatever overlaps inside it.
	IntervalLatency latency.Summary
	Batches         int
	// Calls counts the target calls (fixed-latency runs, and runs against a
	// local target that counts them).
	Calls int64
	// Publishing is the time the engine spent in its publishers' Publish
	// calls, summed over dispatchers, and Publishes how many there were;
	// Gaps summarises the time from the end of one Publish to the start of
	// the next on the same dispatcher: what a hot key waits between two of
	// its runs (the run's completion, then the next claim).
	Publishing time.Duration
	Publishes  int
	Gaps       latency.Summary
	// Served is the local target's own time over the run's calls (see
	// LocalTarget.Served; zero when it does not say).
	Served time.Duration
}

// Rate is messages per second.
func (r BurnDownResult) Rate() float64 { return float64(r.Messages) / r.Elapsed.Seconds() }

// IntervalRate is the rate at the p50 batch interval: the dispatchers'
// full batches back to back, each as fast as the median one. Other work on
// the machine moves it far less than it moves Rate.
func (r BurnDownResult) IntervalRate() float64 {
	if r.IntervalLatency.P50 == 0 {
		return 0
	}
	if r.Options.fullBatch() == AnyClaim {
		return 0 // claims of every size: no one batch to rate the interval by
	}
	return float64(r.Options.Dispatchers*r.Options.fullBatch()) / r.IntervalLatency.P50.Seconds()
}

// BurnDownOptions say how to drain the queue.
type BurnDownOptions struct {
	BatchSize   int
	Dispatchers int
	// Conns is each dispatcher's pool size (1 when zero).
	Conns int
	// Publisher makes each dispatcher's publisher (NoOp when nil).
	Publisher func() publish.Publisher
	// Target, when set, replaces the catch-all route and Publisher: its
	// route table, and the real publishers the dispatch function builds
	// for it.
	Target *LocalTarget
	// OrderedRun is the engine's OrderedRun (0: the engine's default).
	OrderedRun int
	// FullBatch is the claim size the claim, completion and interval
	// figures count as a full batch (BatchSize when zero; AnyClaim: every
	// claim that brought messages). One hot key's claims carry one run
	// each, and a run grows while its key is alone.
	FullBatch int
}

// AnyClaim as BurnDownOptions.FullBatch counts every claim that brought
// messages, whatever its size.
const AnyClaim = -1

// counted reports whether a claim or completion of n messages counts in the
// figures of full batches of size full.
func counted(n, full int) bool { return n > 0 && (full == AnyClaim || n == full) }

func (o BurnDownOptions) fullBatch() int {
	if o.FullBatch != 0 {
		return o.FullBatch
	}
	return o.BatchSize
}

// timedStore is a dispatch.Store that counts batches and times the
// intervals between full-batch completions. The pipelined engine calls
// ClaimBatch and CompleteBatch from different goroutines, so it locks.
type timedStore struct {
	inner     dispatch.Store
	batchSize int

	mu        sync.Mutex
	batches   int
	lastEnd   time.Time
	intervals []time.Duration
}

func (s *timedStore) ClaimBatch(ctx context.Context, p lease.ClaimParams) ([]outboxtype.Message, error) {
	msgs, err := s.inner.ClaimBatch(ctx, p)
	if len(msgs) > 0 {
		s.mu.Lock()
		s.batches++
		s.mu.Unlock()
	}
	return msgs, err
}

func (s *timedStore) CompleteBatch(ctx context.Context, worker string, rs []lease.Result) ([]lease.Completion, error) {
	cs, err := s.inner.CompleteBatch(context.WithValue(ctx, completionSizeKey{}, len(rs)), worker, rs)
	end := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !counted(len(rs), s.batchSize) || err != nil {
		s.lastEnd = time.Time{}
		return cs, err
	}
	if !s.lastEnd.IsZero() {
		s.intervals = append(s.intervals, end.Sub(s.lastEnd))
	}
	s.lastEnd = end
	return cs, err
}

// timedPublisher times each Publish call of the publisher it wraps. The
// engine publishes one batch at a time per target, so with one route the
// spans follow each other.
type timedPublisher struct {
	inner publish.Publisher

	mu    sync.Mutex
	spans [][2]time.Time
}

var _ publish.Publisher = (*timedPublisher)(nil)

func (p *timedPublisher) Publish(ctx context.Context, msgs []*outboxtype.Message) []publish.Result {
	began := time.Now()
	results := p.inner.Publish(ctx, msgs)
	ended := time.Now()
	p.mu.Lock()
	p.spans = append(p.spans, [2]time.Time{began, ended})
	p.mu.Unlock()
	return results
}

// callTracer is a pgx.QueryTracer that times outbox.claim_batch and
// outbox.complete_batch from the statement's start to its rows' close, on
// the connection: the time a call holds it, without any wait for it.
type callTracer struct {
	batchSize int

	mu                sync.Mutex
	claim, complete   time.Duration
	claims, completes []time.Duration
}

type callKind int

const (
	callOther callKind = iota
	callClaim
	callComplete
)

type callStart struct {
	kind  callKind
	began time.Time
	// results is a completion's batch size (its answer has a row only per
	// result that was not recorded as ok).
	results int
}

type callKey struct{}

// completionSizeKey carries a completion's number of results from the
// store's caller to the tracer.
type completionSizeKey struct{}

func (t *callTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	kind := callOther
	switch {
	case strings.Contains(data.SQL, "outbox.claim_batch("):
		kind = callClaim
	case strings.Contains(data.SQL, "outbox.complete_batch("):
		kind = callComplete
	default:
		return ctx
	}
	results, _ := ctx.Value(completionSizeKey{}).(int)
	return context.WithValue(ctx, callKey{}, callStart{kind: kind, began: time.Now(), results: results})
}

func (t *callTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	c, ok := ctx.Value(callKey{}).(callStart)
	if !ok {
		return
	}
	took := time.Since(c.began)
	full := data.Err == nil && counted(int(data.CommandTag.RowsAffected()), t.batchSize)
	if c.kind == callComplete {
		full = data.Err == nil && counted(c.results, t.batchSize)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch c.kind {
	case callClaim:
		t.claim += took
		if full {
			t.claims = append(t.claims, took)
		}
	case callComplete:
		t.complete += took
		if full {
			t.completes = append(t.completes, took)
		}
	}
}

// BurnDown drains db's pending queue with opt.Dispatchers concurrent
// engines, each with its own pool (of one connection unless opt.Conns says
// otherwise), as separate Lambda invocations are, claiming opt.BatchSize at
// a time. Each engine repeats
// bounded runs until a claim comes back empty. It checks that every
// message was delivered.
func BurnDown(ctx context.Context, db *scratch.DB, opt BurnDownOptions) (BurnDownResult, error) {
	if opt.Publisher == nil {
		opt.Publisher = NoOp
	}
	table := routesJSON
	if opt.Target != nil {
		table = opt.Target.Routes
	}
	routes, err := route.Parse([]byte(table), route.Options{})
	if err != nil {
		return BurnDownResult{}, err
	}
	if err := db.Exec(ctx, "VACUUM ANALYZE outbox.pending"); err != nil {
		return BurnDownResult{}, err
	}
	type worker struct {
		pool   *pgxpool.Pool
		store  *timedStore
		tracer *callTracer
		engine *dispatch.Engine
		pubs   []*timedPublisher
		pub    publish.Publisher
	}
	workers := make([]*worker, opt.Dispatchers)
	defer func() {
		for _, w := range workers {
			if w != nil && w.pool != nil {
				w.pool.Close()
			}
		}
	}()
	full := opt.fullBatch()
	for i := range workers {
		tracer := &callTracer{batchSize: full}
		pool, err := db.Pool(ctx, max(opt.Conns, 1), func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
		if err != nil {
			return BurnDownResult{}, err
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return BurnDownResult{}, err
		}
		w := &worker{pool: pool, store: &timedStore{inner: lease.NewStore(pool), batchSize: full}, tracer: tracer}
		workers[i] = w
		publishers := map[string]publish.Publisher{}
		if opt.Target != nil {
			if publishers, err = opt.Target.Publishers(ctx, routes); err != nil {
				return BurnDownResult{}, err
			}
		} else {
			w.pub = opt.Publisher()
			publishers[routes.Routes[0].Target.Key()] = w.pub
		}
		for key, p := range publishers {
			tp := &timedPublisher{inner: p}
			w.pubs = append(w.pubs, tp)
			publishers[key] = tp
		}
		w.engine, err = dispatch.New(dispatch.Config{BatchSize: opt.BatchSize, MaxBatches: 1000, OrderedRun: opt.OrderedRun},
			w.store, routes, publishers, nil)
		if err != nil {
			return BurnDownResult{}, err
		}
	}
	var want int
	if err := workers[0].pool.QueryRow(ctx, "SELECT count(*) FROM outbox.pending").Scan(&want); err != nil {
		return BurnDownResult{}, err
	}
	var callsBefore int64
	var servedBefore time.Duration
	if opt.Target != nil && opt.Target.Calls != nil {
		callsBefore = opt.Target.Calls()
	}
	if opt.Target != nil && opt.Target.Served != nil {
		servedBefore = opt.Target.Served()
	}

	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		delivered int
		firstErr  error
	)
	start := time.Now()
	for i, w := range workers {
		wg.Go(func() {
			id := fmt.Sprintf("bench-%d", i)
			for {
				sum, err := w.engine.Run(ctx, dispatch.Request{WorkerID: id})
				mu.Lock()
				delivered += sum.Delivered
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil && sum.Claimed != sum.Delivered && firstErr == nil {
					firstErr = fmt.Errorf("burn-down: a run claimed %d messages but delivered %d (%d retried, %d dead, %d released, %d lease lost)",
						sum.Claimed, sum.Delivered, sum.Retried, sum.Dead, sum.Released, sum.LeaseLost)
				}
				mu.Unlock()
				if err != nil || sum.Claimed == 0 || firstErr != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return BurnDownResult{}, firstErr
	}
	var left int
	if err := workers[0].pool.QueryRow(ctx, "SELECT count(*) FROM outbox.pending").Scan(&left); err != nil {
		return BurnDownResult{}, err
	}
	if delivered != want || left != 0 {
		return BurnDownResult{}, fmt.Errorf("burn-down delivered %d of %d messages, %d left pending", delivered, want, left)
	}
	res := BurnDownResult{Options: opt, Messages: delivered, Elapsed: elapsed}
	var claims, completes, intervals, gaps []time.Duration
	for _, w := range workers {
		intervals = append(intervals, w.store.intervals...)
		res.Batches += w.store.batches
		res.Claim += w.tracer.claim
		res.Complete += w.tracer.complete
		claims = append(claims, w.tracer.claims...)
		completes = append(completes, w.tracer.completes...)
		if lp, ok := w.pub.(*latencyPublisher); ok {
			res.Calls += lp.calls.Load()
		}
		for _, tp := range w.pubs {
			for j, s := range tp.spans {
				res.Publishing += s[1].Sub(s[0])
				res.Publishes++
				if j > 0 && len(w.pubs) == 1 {
					gaps = append(gaps, s[0].Sub(tp.spans[j-1][1]))
				}
			}
		}
	}
	if opt.Target != nil && opt.Target.Calls != nil {
		res.Calls = opt.Target.Calls() - callsBefore
	}
	if opt.Target != nil && opt.Target.Served != nil {
		res.Served = opt.Target.Served() - servedBefore
	}
	if len(claims) > 0 {
		res.ClaimLatency = latency.Summarise(claims)
	}
	res.CompleteLatency = latency.Summarise(completes)
	res.IntervalLatency = latency.Summarise(intervals)
	res.Gaps = latency.Summarise(gaps)
	return res, nil
}

// NoOp is the publisher of the burn-down runs.
func NoOp() publish.Publisher { return noopPublisher{} }

// FixedLatency returns a publisher whose calls carry perCall messages and
// take latency each, concurrency at a time.
func FixedLatency(perCall, concurrency int, latency time.Duration) func() publish.Publisher {
	return func() publish.Publisher {
		return &latencyPublisher{PerCall: perCall, Concurrency: concurrency, Latency: latency}
	}
}
