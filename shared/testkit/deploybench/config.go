package deploybench

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
)

// Config is one run: the deployment, the offered load and the target.
type Config struct {
	// DatabaseURL names a migrated database, as a superuser (to turn on
	// the counting of claim_batch calls). Required.
	DatabaseURL string
	// DispatchBinary is the dispatch bootstrap (lambdatest.BuildBinary).
	// Required.
	DispatchBinary string

	// Rate is the offered load in messages per second, in transactions
	// of MessagesPerTx (default 5), for Duration (default 60 s). Zero
	// offers none: the run then shows what an idle deployment does (its
	// claims per second), or drains the Backlog.
	Rate          float64
	MessagesPerTx int
	Duration      time.Duration
	// Backlog messages are committed before the schedule starts (in
	// transactions of 1,000 with EnqueueBatch, or in bulk with
	// BulkBacklog), and measured apart from the offered load: how fast
	// the deployment drains a backlog.
	Backlog int
	// BulkBacklog writes the backlog with INSERT ... SELECT
	// (workload.CommitBulkBacklog) instead of producers' transactions: a
	// million messages load in seconds instead of most of a minute. Its
	// payloads carry their message ids, which TargetEventBridge needs.
	BulkBacklog bool

	// Target is the route's target: TargetWebhook (the default) or
	// TargetEventBridge.
	Target string
	// TargetLatency is the webhook target's time per call (default 20 ms);
	// RouteConcurrency the route's calls in flight (default 64 for the
	// webhook: enough for the offered rate at that latency, so that the
	// target is not the bottleneck; the route's default, 8, for
	// EventBridge, whose calls carry 10 messages and are answered at
	// once).
	TargetLatency    time.Duration
	RouteConcurrency int

	// Schedule is the dispatch schedule (default the template's
	// "rate(1 minute)"), run Compression times faster (default 1: real
	// time, since a lingering invocation outlasts a tick and a compressed
	// schedule would stack them).
	Schedule    string
	Compression float64
	// Timeout, MemoryMB and ReservedConcurrency are the dispatch
	// function's (defaults the template's: 75 s, 256 MB,
	// DispatchMaxWorkers 8).
	Timeout             time.Duration
	MemoryMB            int
	ReservedConcurrency int
	// Async is the function's asynchronous invocation configuration
	// (default: the template's MaximumRetryAttempts 0, Lambda's other
	// defaults).
	Async lambdaemu.AsyncConfig
	// CPU caps each execution environment (default unlimited: the
	// machine's cores). lambdaemu.CPULambdaShare gives each the share
	// Lambda gives MemoryMB; Report.CPUShare says what was applied.
	CPU lambdaemu.CPUShare
	// FunctionEnv adds to or overrides the dispatch function's
	// environment, which starts as the template's defaults
	// (TemplateEnv).
	FunctionEnv []string

	// Drain bounds the wait for the last messages after the producers
	// stop (default three ticks plus the timeout, plus a millisecond per
	// backlog message).
	Drain time.Duration
	// StopWhenDrained ends the run once every message has arrived and the
	// fan-out workers have returned: the invocations still lingering are
	// ended by the emulator (as at a deployment's teardown) instead of
	// waited for until their deadline, up to the timeout later. For runs
	// that measure latency or a drain; an idle run measures the lingering
	// itself and must wait for it.
	StopWhenDrained bool
	// Logf, when set, hears about progress.
	Logf func(format string, args ...any) `json:"-"`
}

// Targets of Config.Target.
const (
	// TargetWebhook is a signed webhook that answers after TargetLatency
	// (workload.Target): the offered-load and latency runs.
	TargetWebhook = "webhook"
	// TargetEventBridge is an EventBridge route (calls of up to 10
	// entries) to a local endpoint of the EventBridge API that answers at
	// once (workload.EventBus, through AWS_ENDPOINT_URL_EVENTBRIDGE): a
	// target that is not the bottleneck, for a drain to compare with the
	// bare-SQL floor. Its entries carry the payload only, so it measures
	// a BulkBacklog alone (Rate 0).
	TargetEventBridge = "eventbridge"
)

// Template defaults of the dispatch function (template.yaml).
const (
	TemplateSchedule     = "rate(1 minute)"
	TemplateTimeout      = 75 * time.Second
	TemplateMemoryMB     = 256
	TemplateBatchSize    = 500
	TemplateMaxBatches   = 20
	TemplateOrderedRun   = 100
	TemplateMaxWorkers   = 8
	TemplateLinger       = "on"
	TemplateListen       = "on"
	TemplatePollInterval = "250ms"
	// TemplateMaximumEventAge is the dispatch function's
	// MaximumEventAgeInSeconds: a tick or a fan-out event still queued
	// after it is dropped.
	TemplateMaximumEventAge = time.Minute
)

// TemplateEnv is the dispatch function's environment as the template sets
// it by default, less the database and routes, which the run supplies.
func TemplateEnv(timeout time.Duration) []string {
	return []string{
		fmt.Sprintf("OUTBOX_BATCH_SIZE=%d", TemplateBatchSize),
		fmt.Sprintf("OUTBOX_MAX_BATCHES=%d", TemplateMaxBatches),
		fmt.Sprintf("OUTBOX_ORDERED_RUN=%d", TemplateOrderedRun),
		fmt.Sprintf("OUTBOX_FUNCTION_TIMEOUT=%ds", int(timeout.Seconds())),
		fmt.Sprintf("OUTBOX_MAX_WORKERS=%d", TemplateMaxWorkers),
		"OUTBOX_LINGER=" + TemplateLinger,
		"OUTBOX_LISTEN=" + TemplateListen,
		"OUTBOX_POLL_INTERVAL=" + TemplatePollInterval,
		"OUTBOX_METRICS_NAMESPACE=Outbox",
		// LoggingConfig: LogFormat JSON, ApplicationLogLevel INFO.
		"AWS_LAMBDA_LOG_FORMAT=JSON",
		"AWS_LAMBDA_LOG_LEVEL=INFO",
	}
}

func (c Config) withDefaults() Config {
	if c.MessagesPerTx == 0 {
		c.MessagesPerTx = 5
	}
	if c.Duration == 0 {
		c.Duration = time.Minute
	}
	if c.Target == "" {
		c.Target = TargetWebhook
	}
	if c.TargetLatency == 0 && c.Target == TargetWebhook {
		c.TargetLatency = 20 * time.Millisecond
	}
	if c.RouteConcurrency == 0 && c.Target == TargetWebhook {
		c.RouteConcurrency = 64
	}
	if c.Schedule == "" {
		c.Schedule = TemplateSchedule
	}
	if c.Compression == 0 {
		c.Compression = 1
	}
	if c.Timeout == 0 {
		c.Timeout = TemplateTimeout
	}
	if c.MemoryMB == 0 {
		c.MemoryMB = TemplateMemoryMB
	}
	if c.ReservedConcurrency == 0 {
		c.ReservedConcurrency = TemplateMaxWorkers
	}
	if c.Async.MaximumEventAge == 0 {
		c.Async.MaximumEventAge = TemplateMaximumEventAge
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("deploybench: DatabaseURL is required"))
	}
	if c.DispatchBinary == "" {
		errs = append(errs, errors.New("deploybench: DispatchBinary is required"))
	}
	if c.Rate < 0 || c.Backlog < 0 || c.Duration < 0 || c.TargetLatency < 0 || c.Drain < 0 {
		errs = append(errs, errors.New("deploybench: Rate, Backlog, Duration, TargetLatency and Drain must not be negative"))
	}
	switch c.Target {
	case TargetWebhook:
	case TargetEventBridge:
		if c.Rate > 0 || !c.BulkBacklog {
			errs = append(errs, errors.New("deploybench: the EventBridge target tells messages apart by the id in their payload, which only a BulkBacklog writes: it needs Rate 0 and BulkBacklog"))
		}
		if c.TargetLatency != 0 {
			errs = append(errs, errors.New("deploybench: the EventBridge target answers at once; TargetLatency is the webhook's"))
		}
	default:
		errs = append(errs, fmt.Errorf("deploybench: Target must be %q or %q, got %q", TargetWebhook, TargetEventBridge, c.Target))
	}
	if c.Timeout%time.Second != 0 {
		errs = append(errs, fmt.Errorf("deploybench: Timeout must be whole seconds, as Lambda's, got %s", c.Timeout))
	}
	if _, err := lambdaemu.ParseRate(c.Schedule); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// tick is the real time between two scheduled invocations.
func (c Config) tick() time.Duration {
	rate, _ := lambdaemu.ParseRate(c.Schedule)
	return time.Duration(float64(rate) / c.Compression)
}
