package dispatch

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/config"
)

// Config is the engine's configuration. Zero fields take their defaults.
type Config struct {
	// BatchSize is the most messages one claim takes
	// (1..config.MaxBatchSize).
	BatchSize int
	// MaxBatches bounds the claims of one run (1..config.MaxMaxBatches).
	MaxBatches int
	// Namespaces restricts claims to these namespaces (default: all).
	Namespaces []string
	// OrderedRun is the most messages of one ordering key a claim hands
	// out: the key's head and the messages queued behind it,
	// delivered in order. A hot key delivers about OrderedRun messages per
	// claim-and-complete cycle, so this keeps a target busy with one key.
	// A hot key alone in the queue gets longer runs, up to the batch size,
	// while they publish in under a second (see the package doc).
	OrderedRun int
	// BatchBytes bounds the payload bytes of one claim (at least
	// config.MinBatchBytes): the
	// dispatcher's memory budget per batch. Two batches are in memory at
	// once (one published while the next is claimed), each about three
	// times its payload bytes with the encoded requests.
	BatchBytes int64
	// Lease is how long a claim holds its messages in a run without a
	// deadline (outboxctl serve, make run). A run under a deadline (every
	// Lambda invocation) leases each claim for the time it has left plus
	// SafetyMargin instead: see Engine.claimLease.
	Lease time.Duration
	// FunctionTimeout is the Lambda function's configured timeout; zero
	// outside Lambda. It sizes fan-out: how much one invocation can
	// deliver before its deadline.
	FunctionTimeout time.Duration
	// SafetyMargin: no batch is claimed that would start publishing with
	// less than this left before the deadline (for a batch
	// claimed ahead, the slowest publishing of the run so far is counted
	// in). It must cover one batch's publishing and completion.
	SafetyMargin time.Duration
	// CompletionReserve is cut from the publishers' time so that the
	// completion call still fits before the deadline
	// (DefaultCompletionReserve, or half the safety margin when that is
	// less).
	CompletionReserve time.Duration
	// TargetConcurrency bounds how many targets are published to at once
	// within a batch; each publisher bounds its own calls.
	TargetConcurrency int
	// Clock and Jitter are injectable for tests.
	Clock  func() time.Time
	Jitter backoff.Jitter

	// Names names the settings in Validate's messages.
	Names Names
}

// Names are what the operator calls the settings that Validate's messages
// point at; the config package names them after their environment
// variables. A zero field is the Config field's Go name.
type Names struct {
	BatchSize         string
	MaxBatches        string
	Lease             string
	SafetyMargin      string
	OrderedRun        string
	BatchBytes        string
	TargetConcurrency string
}

func (n Names) withDefaults() Names {
	for _, f := range []struct {
		name *string
		def  string
	}{
		{&n.BatchSize, "BatchSize"}, {&n.MaxBatches, "MaxBatches"}, {&n.Lease, "Lease"},
		{&n.SafetyMargin, "SafetyMargin"}, {&n.OrderedRun, "OrderedRun"}, {&n.BatchBytes, "BatchBytes"},
		{&n.TargetConcurrency, "TargetConcurrency"},
	} {
		if *f.name == "" {
			*f.name = f.def
		}
	}
	return n
}

// DefaultCompletionReserve is the completion reserve unless half the
// safety margin is less. The other defaults and limits, those of
// environment variables, are the config package's (config.DefaultBatchSize,
// config.MaxBatchSize, …): declared once, in the registry.
const DefaultCompletionReserve = 2 * time.Second

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, config.DefaultBatchSize)
	c.MaxBatches = cmp.Or(c.MaxBatches, config.DefaultMaxBatches)
	c.Lease = cmp.Or(c.Lease, config.DefaultLease)
	c.SafetyMargin = cmp.Or(c.SafetyMargin, config.DefaultSafetyMargin)
	c.CompletionReserve = cmp.Or(c.CompletionReserve, min(DefaultCompletionReserve, c.SafetyMargin/2))
	c.TargetConcurrency = cmp.Or(c.TargetConcurrency, config.DefaultTargetConcurrency)
	c.OrderedRun = cmp.Or(c.OrderedRun, config.DefaultOrderedRun)
	c.BatchBytes = cmp.Or(c.BatchBytes, config.DefaultBatchBytes)
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Jitter == nil {
		c.Jitter = backoff.FullJitter
	}
	c.Names = c.Names.withDefaults()
	return c
}

// Validate reports every setting out of range, each named by Names, so
// that a bad deployment fails its cold start. Zero fields are checked with
// their defaults.
func (c Config) Validate() error {
	c = c.WithDefaults()
	n := c.Names
	var errs []error
	if c.BatchSize < 1 || c.BatchSize > config.MaxBatchSize {
		errs = append(errs, fmt.Errorf("%s must be between 1 and %d, got %d", n.BatchSize, config.MaxBatchSize, c.BatchSize))
	}
	if c.MaxBatches < 1 || c.MaxBatches > config.MaxMaxBatches {
		errs = append(errs, fmt.Errorf("%s must be between 1 and %d, got %d", n.MaxBatches, config.MaxMaxBatches, c.MaxBatches))
	}
	if c.Lease < time.Second {
		errs = append(errs, fmt.Errorf("%s must be at least 1s, got %s", n.Lease, c.Lease))
	}
	if c.SafetyMargin <= 0 {
		errs = append(errs, fmt.Errorf("%s must be positive, got %s", n.SafetyMargin, c.SafetyMargin))
	}
	if c.CompletionReserve <= 0 || c.CompletionReserve >= c.SafetyMargin {
		errs = append(errs, fmt.Errorf("the completion reserve (%s) must be positive and below %s (%s)", c.CompletionReserve, n.SafetyMargin, c.SafetyMargin))
	}
	if c.OrderedRun < 1 || c.OrderedRun > config.MaxBatchSize {
		errs = append(errs, fmt.Errorf("%s must be between 1 and %d, got %d", n.OrderedRun, config.MaxBatchSize, c.OrderedRun))
	}
	if c.BatchBytes < config.MinBatchBytes {
		errs = append(errs, fmt.Errorf("%s must be at least 1 MiB (%d), got %d", n.BatchBytes, config.MinBatchBytes, c.BatchBytes))
	}
	if c.TargetConcurrency < 1 {
		errs = append(errs, fmt.Errorf("%s must be at least 1, got %d", n.TargetConcurrency, c.TargetConcurrency))
	}
	if c.FunctionTimeout < 0 {
		errs = append(errs, fmt.Errorf("the function timeout must not be negative, got %s", c.FunctionTimeout))
	}
	if c.Lease <= c.SafetyMargin {
		errs = append(errs, fmt.Errorf("%s (%s) must be longer than %s (%s): a batch's publishing stops %s before its lease expires",
			n.Lease, c.Lease, n.SafetyMargin, c.SafetyMargin, n.SafetyMargin))
	}
	return errors.Join(errs...)
}
