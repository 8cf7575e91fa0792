// Package faults holds the time faults the wire-level AWS fakes share:
// latency and stalls. snsfake, eventbridgefake and lambdafake embed
// [Controls], so that SetLatency, Stall and Resume mean the same thing on
// each of them, and each handler holds its answer with [Wait].
//
// The fakes that publishers fan out to (snsfake, eventbridgefake) also
// embed [InFlight], so that MaxInFlight — what a test of a publisher's
// concurrency bound reads — is counted the same way on each; each handler
// brackets a call with [Enter].
//
// The fakes' other faults (failed entries, failed calls, dropped
// connections) stay with each fake: they are shaped by the service's own
// answers, which differ.
package faults

import (
	"context"
	"sync"
	"time"
)

// Controls are a fake's latency and stall settings. The zero value has no
// latency and is not stalled; its methods are safe for concurrent use.
type Controls struct {
	mu       sync.Mutex
	latency  time.Duration
	stalled  bool
	released chan struct{} // closed by Release; made on first use
}

// SetLatency makes every later call take d (0 for none) from the request's
// arrival to its answer, the fake's own work included. A call whose client
// gives up first is not answered, and nothing it carried is accepted.
func (c *Controls) SetLatency(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.latency = d
}

// Stall holds every later call unanswered, and nothing it carries
// accepted, until its client gives up or the test ends: a black hole, as a
// dead connection or a wedged service looks to the caller.
func (c *Controls) Stall() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stalled = true
}

// Resume ends a Stall for calls that arrive from now on; calls already held
// stay held until their clients give up, so that no stalled call is ever
// accepted.
func (c *Controls) Resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stalled = false
}

// releasedLocked is the channel Release closes.
func (c *Controls) releasedLocked() chan struct{} {
	if c.released == nil {
		c.released = make(chan struct{})
	}
	return c.released
}

// Release lets every held call go, unanswered, as it does every later one
// that would be held: a fake calls it when its test ends, before it closes
// its server, which would otherwise wait for the held calls. It is a
// function rather than a method so that a fake embedding Controls does not
// offer it to tests.
func Release(c *Controls) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.releasedLocked()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// Wait holds a call that arrived at arrived until the latency has passed
// since then, or for good while the fake is stalled (the stall as it was
// when the call got here). It returns false when the call must not be
// answered: its client gave up (ctx, the request's context), or the fake
// was released.
func Wait(ctx context.Context, c *Controls, arrived time.Time) bool {
	c.mu.Lock()
	latency, stalled, released := c.latency, c.stalled, c.releasedLocked()
	c.mu.Unlock()
	var elapsed <-chan time.Time
	due := arrived.Add(latency)
	switch remaining := time.Until(due); {
	case stalled:
		// nil channel: wait for the client or the end of the test only.
	case remaining > preciseFinish:
		timer := time.NewTimer(remaining - preciseFinish)
		defer timer.Stop()
		elapsed = timer.C
	case remaining > 0:
		return finish(ctx, released, due)
	default:
		return true
	}
	select {
	case <-elapsed:
		return finish(ctx, released, due)
	case <-ctx.Done():
		return false
	case <-released:
		return false
	}
}

// preciseFinish is how much of a latency Wait sleeps precisely rather than
// on a runtime timer. Go's timers wake through the network poller, whose
// wait on Linux counts whole milliseconds (epoll_wait): a 20 ms latency
// took 20 to 21 ms, and a benchmark counted the fake's extra fraction of a
// millisecond per call as the client's. So Wait sleeps on a timer to
// within preciseFinish of the due time, then the rest with sleepUntil.
const preciseFinish = 2 * time.Millisecond

// finish sleeps until due, then answers whether the call may still be
// answered: its client may have given up meanwhile.
func finish(ctx context.Context, released <-chan struct{}, due time.Time) bool {
	sleepUntil(due)
	select {
	case <-ctx.Done():
		return false
	case <-released:
		return false
	default:
		return true
	}
}

// InFlight counts the calls a fake is serving at once, and the most it has
// served at once. The zero value has served none; its methods are safe for
// concurrent use.
type InFlight struct {
	mu       sync.Mutex
	now, max int
}

// MaxInFlight is the most calls the fake has served at once: with a
// latency set, what a client's concurrency bound let through.
func (f *InFlight) MaxInFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.max
}

// Enter counts a call in, until the returned leave counts it out: a fake's
// handler calls it on arrival and defers leave. It is a function rather
// than a method so that a fake embedding InFlight does not offer it to
// tests.
func Enter(f *InFlight) (leave func()) {
	f.mu.Lock()
	f.now++
	f.max = max(f.max, f.now)
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		f.now--
		f.mu.Unlock()
	}
}
