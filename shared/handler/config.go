package handler

import (
	"errors"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/settings"
)

// LoadReaperSettings reads and validates the reaper variables.
func LoadReaperSettings(getenv func(string) string) (ReaperConfig, int, error) {
	r := settings.NewReader(getenv)
	c := ReaperConfig{
		BatchSize: r.Int("OUTBOX_REAPER_BATCH_SIZE", 1, 100_000),
		MaxRounds: r.Int("OUTBOX_REAPER_MAX_ROUNDS", 1, 1000),
		Retention: lease.PurgeParams{
			AttemptsOlderThan: r.Duration("OUTBOX_ATTEMPTS_RETENTION", 0, 100*365*24*time.Hour),
			DedupeOlderThan:   r.Duration("OUTBOX_DEDUPE_RETENTION", 0, 100*365*24*time.Hour),
			KeysOlderThan:     r.Duration("OUTBOX_KEY_RETENTION", 0, 100*365*24*time.Hour),
			MaxRows:           r.Int("OUTBOX_PURGE_MAX_ROWS", 1, 1_000_000),
		},
		SafetyMargin: 3 * time.Second,
	}
	ceiling := AttemptCeiling(r)
	if d := c.Retention.AttemptsOlderThan; d > 0 && d < time.Hour {
		r.Fail("OUTBOX_ATTEMPTS_RETENTION", "must be 0 (keep) or at least 1h: the archive is the audit trail, got %s", d)
	}
	if d := c.Retention.DedupeOlderThan; d > 0 && d < time.Hour {
		r.Fail("OUTBOX_DEDUPE_RETENTION", "must be 0 (keep) or at least 1h: a shorter window lets producer retries enqueue duplicates, got %s", d)
	}
	if d := c.Retention.KeysOlderThan; d > 0 && d < time.Hour {
		r.Fail("OUTBOX_KEY_RETENTION", "must be 0 (keep) or at least 1h, got %s", d)
	}
	return c, ceiling, r.Err()
}

// AttemptCeiling reads OUTBOX_ATTEMPT_CEILING, the attempts after which the
// database dead-letters a message whatever its route says. The dispatch
// function gives the same value to the store and to the routes, whose
// retry.max_attempts it bounds; the reaper gives it to the store.
func AttemptCeiling(r *settings.Reader) int {
	return r.Int("OUTBOX_ATTEMPT_CEILING", 1, 100_000)
}

// LoadReplaySettings reads the replay variables.
func LoadReplaySettings(getenv func(string) string) (maxLimit int, err error) {
	r := settings.NewReader(getenv)
	maxLimit = r.Int("OUTBOX_REPLAY_MAX_LIMIT", 1, 10_000)
	return maxLimit, r.Err()
}

// ErrNoDatabase is what a function without any database setting reports.
var ErrNoDatabase = errors.New("no database configured")
