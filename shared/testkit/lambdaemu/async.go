package lambdaemu

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Lambda's asynchronous invocation defaults.
const (
	DefaultMaximumEventAge    = 6 * time.Hour
	DefaultRetryDelay         = time.Minute
	DefaultThrottleBackoff    = time.Second
	DefaultMaxThrottleBackoff = 5 * time.Minute
)

// AsyncConfig is the function's asynchronous invocation configuration
// (EventInvokeConfig) and the service's retry behaviour.
type AsyncConfig struct {
	// MaximumEventAge discards an event that has not succeeded this long
	// after it was queued (default DefaultMaximumEventAge, Lambda's).
	MaximumEventAge time.Duration
	// MaximumRetryAttempts re-runs an event whose invocation failed
	// (function error, timeout, crash) up to this many times, 0-2.
	// Lambda's default is 2; the zero value here is none, which is what
	// the template configures.
	MaximumRetryAttempts int
	// RetryDelay: retry n follows its failure by n × RetryDelay (default
	// DefaultRetryDelay; Lambda waits about a minute, then two).
	RetryDelay time.Duration
	// ThrottleBackoff is the wait before a throttled event is tried again,
	// doubling with each throttle up to MaxThrottleBackoff (defaults 1 s
	// and 5 min, as Lambda documents).
	ThrottleBackoff, MaxThrottleBackoff time.Duration
}

func (c AsyncConfig) withDefaults() AsyncConfig {
	if c.MaximumEventAge == 0 {
		c.MaximumEventAge = DefaultMaximumEventAge
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.ThrottleBackoff == 0 {
		c.ThrottleBackoff = DefaultThrottleBackoff
	}
	if c.MaxThrottleBackoff == 0 {
		c.MaxThrottleBackoff = DefaultMaxThrottleBackoff
	}
	return c
}

func (c AsyncConfig) validate(function string) error {
	switch {
	case c.MaximumRetryAttempts < 0 || c.MaximumRetryAttempts > 2:
		return fmt.Errorf("lambdaemu: function %s: MaximumRetryAttempts must be between 0 and 2, got %d", function, c.MaximumRetryAttempts)
	case c.MaximumEventAge < 0 || c.RetryDelay < 0 || c.ThrottleBackoff < 0:
		return fmt.Errorf("lambdaemu: function %s: the asynchronous durations must not be negative", function)
	case c.MaxThrottleBackoff < c.ThrottleBackoff:
		return fmt.Errorf("lambdaemu: function %s: MaxThrottleBackoff (%s) is below ThrottleBackoff (%s)", function, c.MaxThrottleBackoff, c.ThrottleBackoff)
	}
	return nil
}

// queuedEvent is one asynchronous invocation waiting in its function's
// queue.
type queuedEvent struct {
	request
	// due is when it may be tried next.
	due     time.Time
	backoff time.Duration
}

// asyncQueue is a function's event queue; guarded by Emulator.mu.
type asyncQueue struct {
	events   []*queuedEvent
	inFlight int
	// wake tells the queue's loop that an event arrived.
	wake chan struct{}
}

// enqueue accepts an Event invocation, as the Invoke API's 202 does: it
// runs later, when capacity allows.
func (e *Emulator) enqueue(f *function, payload []byte, trigger Trigger) (string, error) {
	now := time.Now()
	ev := &queuedEvent{request: request{id: newRequestID(), typ: Event, trigger: trigger, payload: payload, queued: now}, due: now}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return "", ErrClosed
	}
	f.queue.events = append(f.queue.events, ev)
	depth := len(f.queue.events)
	e.mu.Unlock()
	f.obs.count(func(s *Stats) {
		s.AsyncAccepted++
		s.MaxQueueDepth = max(s.MaxQueueDepth, depth)
	})
	select {
	case f.queue.wake <- struct{}{}:
	default:
	}
	return ev.id, nil
}

// runAsyncQueue is the function's event poller: it runs every due event
// that capacity allows, backs off the throttled ones and discards those
// past their maximum age. Like Lambda's, it is not told when capacity
// frees up: a throttled event waits out its backoff.
func (e *Emulator) runAsyncQueue(f *function) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next, ok := e.pollAsyncQueue(f)
		if !ok {
			return
		}
		timer.Reset(time.Until(next))
		select {
		case <-e.ctx.Done():
			return
		case <-f.queue.wake:
		case <-timer.C:
		}
	}
}

// pollAsyncQueue makes one pass over the queue and returns when the next
// one is due.
func (e *Emulator) pollAsyncQueue(f *function) (next time.Time, ok bool) {
	cfg := f.cfg.Async
	now := time.Now()
	next = now.Add(time.Hour)
	type start struct {
		ev   *queuedEvent
		env  *environment
		cold bool
	}
	var starts []start
	var dropped []DroppedEvent
	throttles := 0

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return next, false
	}
	waiting := f.queue.events[:0:0]
	for _, ev := range f.queue.events {
		expires := ev.queued.Add(cfg.MaximumEventAge)
		if !now.Before(expires) {
			dropped = append(dropped, DroppedEvent{RequestID: ev.id, Trigger: ev.trigger, Queued: ev.queued, Dropped: now, Attempts: ev.attempt, Reason: DropMaxEventAge})
			continue
		}
		if ev.due.After(now) {
			waiting = append(waiting, ev)
			next = minTime(next, ev.due, expires)
			continue
		}
		env, cold, err := e.acquireLocked(f)
		var throttled *ThrottledError
		if errors.As(err, &throttled) {
			throttles++
			if ev.backoff == 0 {
				ev.backoff = cfg.ThrottleBackoff
			} else {
				ev.backoff = min(2*ev.backoff, cfg.MaxThrottleBackoff)
			}
			ev.due = now.Add(ev.backoff)
			waiting = append(waiting, ev)
			next = minTime(next, ev.due, expires)
			continue
		}
		if err != nil {
			e.mu.Unlock()
			return next, false
		}
		ev.attempt++
		ev.backoff = 0
		f.queue.inFlight++
		starts = append(starts, start{ev, env, cold})
	}
	f.queue.events = waiting
	e.mu.Unlock()

	for _, d := range dropped {
		f.obs.drop(d)
	}
	if throttles > 0 {
		f.obs.count(func(s *Stats) { s.AsyncThrottles += throttles })
	}
	for _, s := range starts {
		go e.runQueuedEvent(f, s.env, s.cold, s.ev)
	}
	return next, true
}

// runQueuedEvent invokes a dequeued event, then puts it back for a retry
// after a failure, or discards it once its retries are spent.
func (e *Emulator) runQueuedEvent(f *function, env *environment, cold bool, ev *queuedEvent) {
	inv := e.execute(f, env, cold, ev.request)
	cfg := f.cfg.Async
	e.mu.Lock()
	defer e.mu.Unlock()
	f.queue.inFlight--
	switch {
	case inv.Outcome == OutcomeSucceeded || inv.Outcome == OutcomeEmulatorClosed:
		return
	case ev.attempt > cfg.MaximumRetryAttempts:
		f.obs.drop(DroppedEvent{RequestID: ev.id, Trigger: ev.trigger, Queued: ev.queued, Dropped: time.Now(), Attempts: ev.attempt, Reason: DropRetriesExhausted})
		return
	}
	ev.due = time.Now().Add(time.Duration(ev.attempt) * cfg.RetryDelay)
	f.queue.events = append(f.queue.events, ev)
	select {
	case f.queue.wake <- struct{}{}:
	default:
	}
}

func minTime(ts ...time.Time) time.Time {
	m := ts[0]
	for _, t := range ts[1:] {
		if t.Before(m) {
			m = t
		}
	}
	return m
}

// WaitIdle returns once the function has no queued event and no
// invocation in flight, or ctx ends.
func (e *Emulator) WaitIdle(ctx context.Context, function string) error {
	f, err := e.lookup(function)
	if err != nil {
		return err
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		e.mu.Lock()
		idle := len(f.queue.events) == 0 && f.queue.inFlight == 0 && f.busy == 0
		e.mu.Unlock()
		if idle {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lambdaemu: %s still busy: %w", function, ctx.Err())
		case <-tick.C:
		}
	}
}
