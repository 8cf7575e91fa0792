// Package backoff decides when a message that failed with a retryable error is
// tried again: exponential backoff with full jitter, bounded by a maximum
// delay, a floor from the target's Retry-After, and a maximum number of
// attempts after which the message is dead.
//
// Full jitter (a delay drawn uniformly from [0, min(max, base·2^(n-1))])
// spreads the retries of a burst of failures instead of sending them back in
// lockstep; see "Exponential Backoff And Jitter" on the AWS Architecture Blog.
package backoff

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Policy is a retry policy. The zero value is invalid; start from Default.
type Policy struct {
	// MaxAttempts is the number of attempts in all, the first included;
	// when the last one fails retryably the message is dead.
	MaxAttempts int
	// BaseDelay is the cap of the first retry's delay; each further retry
	// doubles the cap up to MaxDelay.
	BaseDelay time.Duration
	// MaxDelay caps the backoff.
	MaxDelay time.Duration
}

// Default is the policy of a route that does not set its own.
var Default = Policy{MaxAttempts: 12, BaseDelay: time.Second, MaxDelay: 15 * time.Minute}

// MaxRetryAfter caps a target's Retry-After (unless MaxDelay is longer), so
// that a bogus header cannot park a message for a year.
const MaxRetryAfter = 24 * time.Hour

// Validate reports the first field out of range.
func (p Policy) Validate() error {
	switch {
	case p.MaxAttempts < 1:
		return fmt.Errorf("max_attempts must be at least 1, got %d", p.MaxAttempts)
	case p.BaseDelay < 0:
		return fmt.Errorf("base_delay must not be negative, got %s", p.BaseDelay)
	case p.MaxDelay < 0:
		return fmt.Errorf("max_delay must not be negative, got %s", p.MaxDelay)
	case p.MaxDelay < p.BaseDelay:
		return fmt.Errorf("max_delay (%s) must not be less than base_delay (%s)", p.MaxDelay, p.BaseDelay)
	}
	return nil
}

// ErrExhausted is returned by Next when no attempt is left.
var ErrExhausted = errors.New("retry: attempts exhausted")

// Jitter draws a uniformly random duration in [0, n]. Tests replace it to pin
// the draw.
type Jitter func(n time.Duration) time.Duration

// FullJitter is the production Jitter.
func FullJitter(n time.Duration) time.Duration {
	if n <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(n) + 1))
}

// Ceiling is the largest backoff delay after failed attempt number attempt
// (from 1): min(MaxDelay, BaseDelay·2^(attempt-1)).
func (p Policy) Ceiling(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := p.BaseDelay
	for i := 1; i < attempt; i++ {
		if d >= p.MaxDelay/2 {
			return p.MaxDelay
		}
		d *= 2
	}
	return min(d, p.MaxDelay)
}

// Exhausted reports whether failed attempt number attempt was the last.
func (p Policy) Exhausted(attempt int) bool { return attempt >= p.MaxAttempts }

// Next returns when to try again after failed attempt number attempt (from 1)
// at now, or ErrExhausted when it was the last. retryAfter is the target's
// own request (HTTP Retry-After, 0 when none): it is a floor on the delay.
func (p Policy) Next(now time.Time, attempt int, retryAfter time.Duration, jitter Jitter) (time.Time, error) {
	if p.Exhausted(attempt) {
		return time.Time{}, ErrExhausted
	}
	if jitter == nil {
		jitter = FullJitter
	}
	delay := jitter(p.Ceiling(attempt))
	if retryAfter > delay {
		delay = min(retryAfter, max(p.MaxDelay, MaxRetryAfter))
	}
	return now.Add(delay), nil
}

// Hold returns when to try again a message held for a configuration failure
// (an access denial, a missing target): such a failure is not the
// message's, so its attempts never run out, and the backoff grows as for
// any retry, from floor up to limit. Half the delay is fixed, half
// jittered, so that a held message is not retried in a tight loop; the
// floor keeps a run from claiming again, within its own invocation, a
// message whose configuration nobody can have fixed yet.
func (p Policy) Hold(now time.Time, attempt int, floor, limit time.Duration, jitter Jitter) time.Time {
	if jitter == nil {
		jitter = FullJitter
	}
	d := min(max(p.Ceiling(attempt), floor), limit)
	return now.Add(d/2 + jitter(d-d/2))
}

// Sleep waits d, or returns false when ctx ends first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
