package backoff_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/backoff"
)

var now = time.Date(2026, 11, 21, 3, 0, 0, 0, time.UTC)

func fixed(fraction float64) backoff.Jitter {
	return func(n time.Duration) time.Duration { return time.Duration(float64(n) * fraction) }
}

func TestCeilingDoublesUpToMax(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{MaxAttempts: 20, BaseDelay: time.Second, MaxDelay: 30 * time.Second}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30}
	for i, w := range want {
		if got := p.Ceiling(i + 1); got != w*time.Second {
			t.Errorf("Ceiling(%d) = %s, want %s", i+1, got, w*time.Second)
		}
	}
	// No overflow far past the cap.
	if got := p.Ceiling(500); got != 30*time.Second {
		t.Errorf("Ceiling(500) = %s", got)
	}
}

func TestNextUsesFullJitter(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{MaxAttempts: 5, BaseDelay: 2 * time.Second, MaxDelay: time.Minute}
	at, err := p.Next(now, 3, 0, fixed(0.5))
	if err != nil || at.Sub(now) != 4*time.Second {
		t.Fatalf("Next = %s, %v; want half of the 8s ceiling", at.Sub(now), err)
	}
	at, _ = p.Next(now, 3, 0, fixed(0))
	if !at.Equal(now) {
		t.Fatalf("zero jitter draw gives %s, want now", at.Sub(now))
	}
	for range 1000 {
		at, _ := p.Next(now, 2, 0, backoff.FullJitter)
		if d := at.Sub(now); d < 0 || d > 4*time.Second {
			t.Fatalf("FullJitter delay %s outside [0, 4s]", d)
		}
	}
}

func TestRetryAfterIsAFloor(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{MaxAttempts: 5, BaseDelay: time.Second, MaxDelay: 10 * time.Second}
	at, _ := p.Next(now, 1, 7*time.Second, fixed(1))
	if at.Sub(now) != 7*time.Second {
		t.Fatalf("Retry-After 7s gives %s", at.Sub(now))
	}
	// A Retry-After shorter than the drawn backoff does not shorten it.
	at, _ = p.Next(now, 4, time.Second, fixed(1))
	if at.Sub(now) != 8*time.Second {
		t.Fatalf("short Retry-After gives %s, want the 8s backoff", at.Sub(now))
	}
	// Beyond MaxDelay it is still honoured, up to MaxRetryAfter.
	at, _ = p.Next(now, 1, time.Hour, fixed(0))
	if at.Sub(now) != time.Hour {
		t.Fatalf("Retry-After 1h gives %s", at.Sub(now))
	}
	at, _ = p.Next(now, 1, 30*24*time.Hour, fixed(0))
	if at.Sub(now) != backoff.MaxRetryAfter {
		t.Fatalf("Retry-After 30d gives %s, want the %s cap", at.Sub(now), backoff.MaxRetryAfter)
	}
}

func TestExhaustedAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{MaxAttempts: 3, BaseDelay: time.Second, MaxDelay: time.Second}
	for attempt := 1; attempt < 3; attempt++ {
		if _, err := p.Next(now, attempt, 0, nil); err != nil {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
	}
	if _, err := p.Next(now, 3, 0, nil); !errors.Is(err, backoff.ErrExhausted) {
		t.Fatalf("attempt 3 of 3: %v, want ErrExhausted", err)
	}
	if !p.Exhausted(3) || p.Exhausted(2) {
		t.Fatal("Exhausted disagrees with MaxAttempts")
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	bad := map[string]backoff.Policy{
		"max_attempts must be at least 1": {MaxAttempts: 0, BaseDelay: time.Second, MaxDelay: time.Second},
		"base_delay must not be negative": {MaxAttempts: 1, BaseDelay: -time.Second, MaxDelay: time.Second},
		"max_delay must not be negative":  {MaxAttempts: 1, BaseDelay: 0, MaxDelay: -time.Second},
		"must not be less than base":      {MaxAttempts: 1, BaseDelay: time.Minute, MaxDelay: time.Second},
	}
	for want, p := range bad {
		if err := p.Validate(); err == nil || !contains(err.Error(), want) {
			t.Errorf("Validate(%+v) = %v, want %q", p, err, want)
		}
	}
	if err := backoff.Default.Validate(); err != nil {
		t.Fatalf("Default: %v", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
