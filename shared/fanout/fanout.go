package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"

	"github.com/outboxkit/dispatcher/shared/lease"
)

// Source marks a fan-out event; ReasonBacklog is the only reason so far.
const (
	Source        = "outbox.fanout"
	ReasonBacklog = "backlog"
)

// Why a decision started nothing, as Decision.Skipped says.
const (
	SkippedGenerationLimit = "generation_limit"
	SkippedNoBacklog       = "no_backlog"
	SkippedNoWorkers       = "max_workers"
	SkippedNoRate          = "no_rate"
)

// estimateCap bounds the count the decision reads: outbox.claimable_estimate
// takes no larger limit (SQLSTATE 22023), and beyond it the fleet is the
// largest allowed anyway at any rate a 2-core database serves.
const estimateCap = 1_000_000

// invokeTimeout bounds one asynchronous Invoke, which Lambda answers on
// acceptance (202), before the worker runs.
const invokeTimeout = 5 * time.Second

// Event is a fan-out invocation's event, as the dispatch function decodes
// it (its fields are dispatchfn.Event's).
type Event struct {
	Source     string   `json:"source"`
	Generation int      `json:"generation"`
	Reason     string   `json:"reason"`
	Backlog    int      `json:"backlog"`
	Namespaces []string `json:"namespaces,omitempty"`
}

// Invoker is the part of *lambda.Client a Starter uses.
type Invoker interface {
	Invoke(ctx context.Context, in *lambda.InvokeInput, optFns ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

var _ Invoker = (*lambda.Client)(nil)

// Estimator counts what claims could take now; *lease.Store is one.
type Estimator interface {
	ClaimableEstimate(ctx context.Context, limit int, namespaces []string) (int, error)
}

var _ Estimator = (*lease.Store)(nil)

// Config bounds fan-out.
type Config struct {
	// Function is the function to invoke: the dispatch function itself
	// (AWS_LAMBDA_FUNCTION_NAME).
	Function string
	// MaxWorkers is the most invocations a backlog runs at once, the
	// starter included; 1 starts none.
	MaxWorkers int
	// Generations: an invocation of this generation or later starts
	// none.
	Generations int
	// FunctionTimeout and SafetyMargin size one worker's share.
	FunctionTimeout time.Duration
	SafetyMargin    time.Duration
	// DrainWithin, when positive, is how soon the fleet should drain the
	// backlog: each invocation's share is what it delivers within it (or
	// before its deadline, when that comes first). Zero: before the
	// deadline.
	DrainWithin time.Duration
}

// Enabled reports whether fan-out may start anything.
func (c Config) Enabled() bool {
	return c.MaxWorkers > 1 && c.Function != "" && c.FunctionTimeout > c.SafetyMargin
}

// Starter decides and starts fan-out. Build one per cold start.
type Starter struct {
	cfg       Config
	invoker   Invoker
	estimator Estimator
}

// New returns a starter.
func New(cfg Config, invoker Invoker, estimator Estimator) (*Starter, error) {
	switch {
	case !cfg.Enabled():
		return nil, fmt.Errorf("fanout: needs a function name, more than one worker and a timeout beyond the safety margin, got %+v", cfg)
	case cfg.Generations < 1:
		return nil, fmt.Errorf("fanout: generations must be at least 1, got %d", cfg.Generations)
	case invoker == nil || estimator == nil:
		return nil, errors.New("fanout: an invoker and an estimator are required")
	}
	return &Starter{cfg: cfg, invoker: invoker, estimator: estimator}, nil
}

// Situation is what the deciding invocation knows of itself.
type Situation struct {
	// Generation is its own (0 for the schedule's).
	Generation int
	// Rate is the messages a second it has claimed so far.
	Rate float64
	// Left is the time until its deadline.
	Left time.Duration
	// Continuous: it goes on claiming until its deadline (otherwise it
	// returns after its run, and takes no share of the backlog). Workers
	// always do.
	Continuous bool
	// Namespaces restricts its claims, and so the workers'.
	Namespaces []string
}

// Decision is what a Starter did.
type Decision struct {
	Backlog int `json:"backlog"`
	// Wanted workers were asked for; Started were accepted, Throttled
	// refused for want of capacity (429), Failed refused otherwise.
	Wanted    int `json:"wanted"`
	Started   int `json:"started"`
	Throttled int `json:"throttled"`
	Failed    int `json:"failed"`
	// Skipped says why none was asked for ("" when some were).
	Skipped string `json:"skipped,omitempty"`
	// FirstFailure is the error of the first Invoke that failed.
	FirstFailure string `json:"-"`
}

// plan sizes the fleet: how many workers to start for backlog.
func (s *Starter) plan(sit Situation, backlog int) int {
	horizon := func(d time.Duration) time.Duration {
		if s.cfg.DrainWithin > 0 {
			d = min(d, s.cfg.DrainWithin)
		}
		return max(d, 0)
	}
	perWorker := sit.Rate * horizon(s.cfg.FunctionTimeout-s.cfg.SafetyMargin).Seconds()
	var own float64
	if sit.Continuous {
		own = sit.Rate * horizon(sit.Left-s.cfg.SafetyMargin).Seconds()
	}
	if float64(backlog) <= own || perWorker < 1 {
		return 0
	}
	return min(int(math.Ceil((float64(backlog)-own)/perWorker)), s.cfg.MaxWorkers-1)
}

// limit is the most the count needs to read: what the largest fleet could
// take, and one more, so that "more than that" can be told.
func (s *Starter) limit(sit Situation) int {
	share := sit.Rate * max(s.cfg.FunctionTimeout, sit.Left).Seconds()
	return int(min(share*float64(s.cfg.MaxWorkers)+1, estimateCap))
}

// ScaleOut counts the backlog and starts the workers it needs. A failed
// count is an error; Invokes that fail are counted in the decision.
func (s *Starter) ScaleOut(ctx context.Context, sit Situation) (Decision, error) {
	switch {
	case sit.Generation >= s.cfg.Generations:
		return Decision{Skipped: SkippedGenerationLimit}, nil
	case sit.Rate <= 0:
		return Decision{Skipped: SkippedNoRate}, nil
	}
	backlog, err := s.estimator.ClaimableEstimate(ctx, s.limit(sit), sit.Namespaces)
	if err != nil {
		return Decision{}, fmt.Errorf("fanout: %w", err)
	}
	d := Decision{Backlog: backlog, Wanted: s.plan(sit, backlog)}
	if d.Wanted == 0 {
		d.Skipped = SkippedNoBacklog
		if s.cfg.MaxWorkers <= 1 {
			d.Skipped = SkippedNoWorkers
		}
		return d, nil
	}
	payload, err := json.Marshal(Event{Source: Source, Generation: sit.Generation + 1, Reason: ReasonBacklog,
		Backlog: backlog, Namespaces: sit.Namespaces})
	if err != nil {
		return d, fmt.Errorf("fanout: %w", err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range d.Wanted {
		wg.Go(func() {
			outcome, err := s.invoke(ctx, payload)
			mu.Lock()
			defer mu.Unlock()
			switch outcome {
			case started:
				d.Started++
			case throttled:
				d.Throttled++
			default:
				d.Failed++
				if d.FirstFailure == "" {
					d.FirstFailure = err.Error()
				}
			}
		})
	}
	wg.Wait()
	return d, nil
}

type invokeOutcome int

const (
	started invokeOutcome = iota
	throttled
	failed
)

// invoke starts one worker, without the SDK's retries: a throttled worker
// is not needed badly enough to wait for.
func (s *Starter) invoke(ctx context.Context, payload []byte) (invokeOutcome, error) {
	ctx, cancel := context.WithTimeout(ctx, invokeTimeout)
	defer cancel()
	_, err := s.invoker.Invoke(ctx, &lambda.InvokeInput{
		FunctionName:   aws.String(s.cfg.Function),
		InvocationType: types.InvocationTypeEvent,
		Payload:        payload,
	}, func(o *lambda.Options) { o.RetryMaxAttempts = 1 })
	if err == nil {
		return started, nil
	}
	if _, ok := errors.AsType[*types.TooManyRequestsException](err); ok {
		return throttled, err
	}
	if apiErr, ok := errors.AsType[smithy.APIError](err); ok && apiErr.ErrorCode() == "TooManyRequestsException" {
		return throttled, err
	}
	return failed, err
}
