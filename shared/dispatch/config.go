package dispatch

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/dispatcher/shared/retry"
)

// Config is the engine's configuration. Zero fields take their defaults.
type Config struct {
	// BatchSize is the most messages one claim takes (default 500, 1-10,000).
	BatchSize int
	// MaxBatches bounds the claims of one run (default 10).
	MaxBatches int
	// Namespaces restricts claims to these namespaces (default: all).
	Namespaces []string
	// OrderedRun is the most messages of one ordering key a claim hands
	// out (default 100): the key's head and the messages queued behind it,
	// delivered in order. A hot key delivers about OrderedRun messages per
	// claim-and-complete cycle, so this keeps a target busy with one key.
	OrderedRun int
	// BatchBytes bounds the payload bytes of one claim (default 64 MiB): the
	// dispatcher's memory budget per batch. Two batches are in memory at
	// once (one published while the next is claimed), each about three
	// times its payload bytes with the encoded requests.
	BatchBytes int64
	// Lease is how long a claim holds its messages (default 5 minutes).
	// It must exceed FunctionTimeout + SafetyMargin: a lease that could
	// expire while this invocation still works would let another worker
	// deliver the same message concurrently.
	Lease time.Duration
	// FunctionTimeout is the Lambda function's configured timeout; zero
	// outside Lambda.
	FunctionTimeout time.Duration
	// SafetyMargin: no batch is claimed that would start publishing with
	// less than this left before the deadline (default 10s; for a batch
	// claimed ahead, the slowest publishing of the run so far is counted
	// in). It must cover one batch's publishing and completion.
	SafetyMargin time.Duration
	// CompletionReserve is cut from the publishers' time so that the
	// completion call still fits before the deadline (default 2s, or half
	// the safety margin when that is less).
	CompletionReserve time.Duration
	// TargetConcurrency bounds how many targets are published to at once
	// within a batch (default 8); each publisher bounds its own calls.
	TargetConcurrency int
	// Clock and Jitter are injectable for tests.
	Clock  func() time.Time
	Jitter retry.Jitter
}

// Defaults.
const (
	DefaultBatchSize         = 500
	DefaultMaxBatches        = 10
	DefaultLease             = 5 * time.Minute
	DefaultSafetyMargin      = 10 * time.Second
	DefaultCompletionReserve = 2 * time.Second
	DefaultTargetConcurrency = 8
	DefaultOrderedRun        = 100
	DefaultBatchBytes        = 64 << 20
	MaxBatchSize             = 10_000
)

func (c Config) withDefaults() Config {
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxBatches == 0 {
		c.MaxBatches = DefaultMaxBatches
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.SafetyMargin == 0 {
		c.SafetyMargin = DefaultSafetyMargin
	}
	if c.CompletionReserve == 0 {
		c.CompletionReserve = min(DefaultCompletionReserve, c.SafetyMargin/2)
	}
	if c.TargetConcurrency == 0 {
		c.TargetConcurrency = DefaultTargetConcurrency
	}
	if c.OrderedRun == 0 {
		c.OrderedRun = DefaultOrderedRun
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = DefaultBatchBytes
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Jitter == nil {
		c.Jitter = retry.FullJitter
	}
	return c
}

// Validate reports every setting out of range, naming its environment
// variable, so that a bad deployment fails its cold start. Zero fields are
// checked with their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		errs = append(errs, fmt.Errorf("OUTBOX_BATCH_SIZE must be between 1 and %d, got %d", MaxBatchSize, c.BatchSize))
	}
	if c.MaxBatches < 1 || c.MaxBatches > 1000 {
		errs = append(errs, fmt.Errorf("OUTBOX_MAX_BATCHES must be between 1 and 1000, got %d", c.MaxBatches))
	}
	if c.Lease < time.Second {
		errs = append(errs, fmt.Errorf("OUTBOX_LEASE must be at least 1s, got %s", c.Lease))
	}
	if c.SafetyMargin <= 0 {
		errs = append(errs, fmt.Errorf("OUTBOX_SAFETY_MARGIN must be positive, got %s", c.SafetyMargin))
	}
	if c.CompletionReserve <= 0 || c.CompletionReserve >= c.SafetyMargin {
		errs = append(errs, fmt.Errorf("the completion reserve (%s) must be positive and below OUTBOX_SAFETY_MARGIN (%s)", c.CompletionReserve, c.SafetyMargin))
	}
	if c.OrderedRun < 1 || c.OrderedRun > MaxBatchSize {
		errs = append(errs, fmt.Errorf("OUTBOX_ORDERED_RUN must be between 1 and %d, got %d", MaxBatchSize, c.OrderedRun))
	}
	if c.BatchBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("OUTBOX_BATCH_MAX_BYTES must be at least 1 MiB (1048576), got %d", c.BatchBytes))
	}
	if c.TargetConcurrency < 1 {
		errs = append(errs, fmt.Errorf("OUTBOX_TARGET_CONCURRENCY must be at least 1, got %d", c.TargetConcurrency))
	}
	if c.FunctionTimeout < 0 {
		errs = append(errs, fmt.Errorf("the function timeout must not be negative, got %s", c.FunctionTimeout))
	}
	if c.Lease <= c.FunctionTimeout+c.SafetyMargin {
		errs = append(errs, fmt.Errorf("OUTBOX_LEASE (%s) must be longer than the function timeout (%s) plus OUTBOX_SAFETY_MARGIN (%s): otherwise a lease can expire while its invocation still delivers, and another worker delivers the same message at the same time",
			c.Lease, c.FunctionTimeout, c.SafetyMargin))
	}
	return errors.Join(errs...)
}
