package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// pipeline is one Run. Every batch goes through four steps,
//
//	claim ─► route ─► publish ─► complete
//
// and consecutive batches overlap, so that a batch's two database round
// trips hide behind the targets' latency instead of adding to it: while
// batch n is routed and published, batch n+1 is claimed ahead and batch n-1
// completes behind.
//
//	            one turn of the loop (deliver)
//	batch n-1   ─ complete (behind) ─►
//	batch n       route ─► publish ──────────► complete (behind) ─►
//	batch n+1   ─ claim (ahead) ─►             route ─► publish …
//
// So up to three batches are leased at once, one of them only until its
// completion returns. Time decides how far ahead the pipeline reaches:
// mayClaim, claimFollowing and pastPublishing hold it to the deadline's
// safety margin and completion reserve (see the package doc, Time).
//
// A step that ends the run returns a stopReason, or the error that ended
// it; either way the run leaves through finish.
type pipeline struct {
	e          *Engine
	ctx        context.Context
	sum        *Summary
	workerID   string
	batchSize  int
	maxBatches int
	namespaces []string
	log        *slog.Logger

	// slowestPublish is the longest a batch's routing and publishing has
	// taken in this run. A batch claimed ahead is published only after the
	// current one, so it is claimed only if the safety margin would still
	// be left then, by this estimate; otherwise it would start short of
	// time and its calls be cut off by the completion reserve.
	slowestPublish time.Duration
	// completing is the previous batch's completion, running behind while
	// the current batch publishes; nil when none is.
	completing chan completed

	// run is the ordered run the next claim asks for: Config.OrderedRun,
	// or longer while one hot key is alone in the queue (see adaptRun).
	// claimedRun is the run the batch being delivered was claimed with.
	run, claimedRun int
}

// lonerRunTime bounds the growth of a lone key's runs: a run grows only
// while its publishing took less (see adaptRun).
const lonerRunTime = time.Second

// stopReason is why a run stopped without an error: Summary.StoppedBy.
type stopReason string

func (s stopReason) Error() string { return "dispatch: the run stopped: " + string(s) }

type claimed struct {
	msgs []outboxtype.Message
	err  error
}

type completed struct {
	part Summary
	err  error
}

// loop moves claimed batches through the pipeline until a step stops it.
func (p *pipeline) loop() error {
	batch, err := p.claimNow()
	for err == nil {
		if len(batch) == 0 {
			batch, err = p.claimAfterCompletion()
		} else {
			batch, err = p.deliver(batch)
		}
	}
	return p.finish(err)
}

// deliver is one turn of the pipeline: it takes a claimed batch through
// route and publish while the batch after it is claimed ahead and the one
// before it completes behind, sets the batch's own completion going behind
// the next, and returns that next batch.
func (p *pipeline) deliver(batch []outboxtype.Message) ([]outboxtype.Message, error) {
	p.sum.Batches++
	p.sum.Claimed += len(batch)
	if p.pastPublishing(batch) {
		// The estimate that let this batch be claimed was wrong: give it
		// back whole rather than start calls that would be cut off.
		p.release(batch)
		return nil, stopReason(StoppedDeadline)
	}

	claimedRun := p.claimedRun
	next := p.claimFollowing()

	started := p.e.cfg.Clock()
	routed := p.e.routeBatch(batch)
	grants := p.e.gateBatch(p.ctx, p.log, p.workerID, &routed, p.sum)
	p.e.publishBatch(p.ctx, routed)
	p.e.recordBatch(p.ctx, p.log, p.workerID, &routed, grants, p.sum)
	took := p.e.cfg.Clock().Sub(started)
	p.slowestPublish = max(p.slowestPublish, took)
	// Its completion records outcomes, not payloads: dropped now, they are
	// freed while the next batch publishes, so that the payloads of two
	// batches are in memory at once (the one published, the one claimed
	// ahead), as the claim's byte budget counts, not three.
	for i := range batch {
		batch[i].Payload = nil
	}

	if err := p.awaitCompletion(); err != nil {
		p.salvage(routed.items, next)
		return nil, err
	}
	p.completeBehind(routed.items)

	following, err := next.batch(p)
	p.adaptRun(batch, claimedRun, took, following)
	return following, err
}

// adaptRun sizes the ordered runs of the claims that follow. A hot key
// alone in the queue — the batch just published was one key's run, cut at
// the run length, and the claim made meanwhile found nothing else — waits
// between its runs for the run's completion and then the next claim, one
// after the other, since a key has one claim in flight at a time. Against a
// target that takes many messages per call (an SNS FIFO topic's
// PublishBatch, 10) a run of OrderedRun is few calls and that wait weighs
// as much as several of them. So while such a key's runs publish in under
// lonerRunTime, its run doubles, up to the batch size. As soon as a batch
// holds anything else, or a claim finds other work, runs are back to
// OrderedRun: messages of other keys that arrive meanwhile wait behind a
// long run for less than about twice lonerRunTime.
func (p *pipeline) adaptRun(published []outboxtype.Message, claimedRun int, took time.Duration, following []outboxtype.Message) {
	alone := len(following) == 0 && len(published) == claimedRun && oneKey(published)
	switch {
	case !alone:
		p.run = min(p.e.cfg.OrderedRun, p.batchSize)
	case took < p.e.lonerRunTime:
		p.run = min(2*claimedRun, p.batchSize)
	}
}

// oneKey reports whether msgs all belong to one ordering key.
func oneKey(msgs []outboxtype.Message) bool {
	for i := range msgs {
		if msgs[i].OrderingKey == "" || msgs[i].OrderingKey != msgs[0].OrderingKey || msgs[i].Namespace != msgs[0].Namespace {
			return false
		}
	}
	return len(msgs) > 0
}

// claimNow claims a batch, if the deadline and the batch budget still
// allow one.
func (p *pipeline) claimNow() ([]outboxtype.Message, error) {
	if why := p.mayClaim(0); why != "" {
		return nil, stopReason(why)
	}
	p.claimedRun = p.run
	return p.claim(p.run)
}

// claimAfterCompletion follows a claim that came back empty. With nothing
// completing, the queue is drained. Otherwise the batch being recorded may
// hold its keys' next messages, which become claimable once it is: look
// again after it.
func (p *pipeline) claimAfterCompletion() ([]outboxtype.Message, error) {
	if p.completing == nil {
		return nil, stopReason(StoppedDrained)
	}
	if err := p.awaitCompletion(); err != nil {
		return nil, err
	}
	return p.claimNow()
}

// following is how the batch after the current one is got: claimed ahead
// while the current one publishes, claimed after it, or not at all (why).
type following struct {
	ahead chan claimed
	run   int // the ordered run the claim ahead asked for
	after bool
	why   stopReason
}

// claimFollowing decides how the batch after the current one is got, and
// starts its claim when it is claimed ahead. Under a deadline, the first
// batch's successor is claimed only after the first is published: until
// then there is no publishing time to judge it by.
func (p *pipeline) claimFollowing() following {
	if _, timed := p.ctx.Deadline(); timed && p.slowestPublish == 0 {
		return following{after: true}
	}
	if why := p.mayClaim(p.slowestPublish); why != "" {
		return following{why: stopReason(why)}
	}
	ahead, run := make(chan claimed, 1), p.run
	go func() {
		msgs, err := p.claim(run)
		ahead <- claimed{msgs, err}
	}()
	return following{ahead: ahead, run: run}
}

// batch is the batch after the current one: the claim made ahead, a claim
// made now, or the reason there is none.
func (f following) batch(p *pipeline) ([]outboxtype.Message, error) {
	switch {
	case f.ahead != nil:
		got := <-f.ahead
		p.claimedRun = f.run
		return got.msgs, got.err
	case f.after:
		return p.claimNow()
	}
	return nil, f.why
}

// mayClaim says why a batch whose publishing starts after waitFor may not
// be claimed ("" when it may): it must start with the safety margin still
// ahead of the deadline, within the batch budget.
func (p *pipeline) mayClaim(waitFor time.Duration) string {
	switch deadline, ok := p.ctx.Deadline(); {
	case p.sum.Batches >= p.maxBatches:
		return StoppedMaxBatches
	case ok && deadline.Sub(p.e.cfg.Clock())-waitFor < p.e.cfg.SafetyMargin, p.ctx.Err() != nil:
		return StoppedDeadline
	}
	return ""
}

// pastPublishing reports whether the publishers' time for batch (see
// publishBatch) is already over.
func (p *pipeline) pastPublishing(batch []outboxtype.Message) bool {
	if p.ctx.Err() != nil {
		return true
	}
	deadline, ok := p.ctx.Deadline()
	if ok && !p.e.cfg.Clock().Before(deadline.Add(-p.e.cfg.CompletionReserve)) {
		return true
	}
	for i := range batch {
		if !time.Now().Before(batch[i].LeaseExpiresAt.Add(-p.e.cfg.SafetyMargin)) {
			return true
		}
	}
	return false
}

// claim is the claim step: one round trip, with ordered runs of up to run
// messages.
func (p *pipeline) claim(run int) ([]outboxtype.Message, error) {
	ctx, span := p.e.tracer.Start(p.ctx, "claim")
	msgs, err := p.e.store.ClaimBatch(ctx, lease.ClaimParams{
		WorkerID: p.workerID, BatchSize: p.batchSize, Lease: p.e.claimLease(p.ctx), Namespaces: p.namespaces,
		MaxRun: run, MaxBytes: p.e.cfg.BatchBytes, MaxPayloadBytes: p.e.maxPayload,
	})
	span.SetAttribute("claimed", len(msgs))
	span.End(err)
	if err != nil {
		return nil, fmt.Errorf("dispatch: claim: %w", err)
	}
	return msgs, nil
}

// completeBehind starts the complete step of a published batch (one round
// trip), to run while the next batch publishes.
func (p *pipeline) completeBehind(items []pending) {
	done := make(chan completed, 1)
	p.completing = done
	go func() {
		var part Summary
		err := p.e.complete(p.ctx, p.log, p.workerID, items, &part)
		done <- completed{part: part, err: err}
	}()
}

// awaitCompletion waits for the completion running behind, if any, and
// adds its figures.
func (p *pipeline) awaitCompletion() error {
	if p.completing == nil {
		return nil
	}
	done := <-p.completing
	p.completing = nil
	p.sum.merge(&done.part)
	return done.err
}

// salvage is the way out when the previous batch's completion failed (the
// database went away): what was just published is still recorded if the
// database takes it, and the batch claimed ahead is given back.
func (p *pipeline) salvage(items []pending, next following) {
	var part Summary
	if p.e.complete(p.ctx, p.log, p.workerID, items, &part) == nil {
		p.sum.merge(&part)
	}
	if next.ahead != nil {
		if got := <-next.ahead; got.err == nil && len(got.msgs) > 0 {
			p.sum.Batches++
			p.sum.Claimed += len(got.msgs)
			p.release(got.msgs)
		}
	}
}

// finish ends the run: the last completion is awaited, and the reason
// recorded when the run stopped without an error.
func (p *pipeline) finish(err error) error {
	why, stopped := err.(stopReason) // never wrapped: the steps return it as is
	if stopped {
		err = nil
	}
	if awaitErr := p.awaitCompletion(); err == nil {
		err = awaitErr
	}
	if err == nil {
		p.sum.StoppedBy = string(why)
	}
	return err
}

// release gives a batch that will not be published back to the queue,
// untouched. It is best effort: if it fails, the leases expire and the
// reaper requeues the messages as it would after a crash.
func (p *pipeline) release(msgs []outboxtype.Message) {
	if len(msgs) == 0 {
		return
	}
	results := make([]lease.Result, len(msgs))
	for i := range msgs {
		results[i] = lease.Result{ID: msgs[i].ID, LeaseToken: msgs[i].LeaseToken, Outcome: outboxtype.OutcomeReleased}
	}
	ctx, cancel := p.e.completionContext(p.ctx)
	defer cancel()
	completions, err := p.e.store.CompleteBatch(ctx, p.workerID, results)
	if err != nil {
		p.log.Warn("could not release a batch that was not published; its leases will expire and the reaper will requeue it",
			"worker_id", p.workerID, "messages", len(msgs), "error", err.Error())
		return
	}
	for _, c := range completions {
		if c.Status == outboxtype.StatusOK {
			p.sum.Released++
		} else {
			p.sum.LeaseLost++
		}
	}
}
