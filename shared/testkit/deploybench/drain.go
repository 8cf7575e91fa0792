package deploybench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.yaml.in/yaml/v3"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
	"github.com/outboxkit/dispatcher/shared/testkit/workload"
)

// DrainConfig is one invocation of the dispatch function draining a
// backlog alone: no schedule, no fan-out, no linger. Its rate is what one
// of the template's DispatchMaxWorkers can take from the database, and
// with Lambda's CPU share it is the deployed function's, not this
// machine's.
type DrainConfig struct {
	// DatabaseURL names a migrated database, as a superuser (the bulk
	// backlog writes outbox.pending directly). Required.
	DatabaseURL string
	// DispatchBinary is the dispatch bootstrap. Required.
	DispatchBinary string
	// Backlog is the messages the invocation drains (default 50,000).
	Backlog int
	// Target is TargetEventBridge (the default) or TargetWebhook; both
	// answer at once.
	Target string
	// MemoryMB is the function's memory (default the template's).
	MemoryMB int
	// CPU caps the environment (default unlimited).
	CPU lambdaemu.CPUShare
	// Timeout is the function's timeout (default the template's).
	Timeout time.Duration
	// FunctionEnv adds to or overrides the function's environment.
	FunctionEnv []string
	// Custom, when set, replaces Target with an endpoint the caller runs
	// (e.g. a test's SNS fake).
	Custom *CustomTarget
}

// CustomTarget is an endpoint the caller runs: its name for the report,
// the function's variables that route every message to it, and the count
// of messages it has accepted.
type CustomTarget struct {
	Name     string
	Env      []string
	Received func() int
}

// DrainResult is what the invocation did.
type DrainResult struct {
	Target   string
	MemoryMB int
	// CPUShare says whether the environment was capped, and why not.
	CPUShare lambdaemu.CPUShareStatus
	// Delivered is the messages the target received; Took the invoke
	// phase (after the cold start, which a warm-up invocation took).
	Delivered int
	Took      time.Duration
	// CPU is the bootstrap's CPU time in the invoke phase; Throttled the
	// CFS counters of its group over the run.
	CPU       time.Duration
	Throttled lambdaemu.CPUStat
	// Batches the invocation claimed, from its answer.
	Batches int
	// StoppedBy is why the invocation returned, from its answer: drained,
	// or deadline when the function's timeout ended it first (on a slow
	// machine; the rate is then of what it delivered before it).
	StoppedBy string
}

// Rate is messages delivered per second of the invoke phase.
func (r DrainResult) Rate() float64 {
	if r.Took <= 0 {
		return 0
	}
	return float64(r.Delivered) / r.Took.Seconds()
}

// CPUPerMessage is the bootstrap's CPU time per message delivered.
func (r DrainResult) CPUPerMessage() time.Duration {
	if r.Delivered == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Delivered)
}

// String is one line for a report.
func (r DrainResult) String() string {
	capped := "unconstrained"
	if r.CPUShare.Enabled {
		capped = fmt.Sprintf("capped at %d MB's share", r.MemoryMB)
	}
	stopped := ""
	if r.StoppedBy == dispatch.StoppedDeadline {
		stopped = "; stopped by the function's timeout"
	}
	return fmt.Sprintf("one invocation, %s, %s: %d messages in %s: %.0f msgs/s, %.1f µs CPU/message (%d batches; throttled in %d of %d periods%s)",
		r.Target, capped, r.Delivered, r.Took.Round(time.Millisecond), r.Rate(), float64(r.CPUPerMessage().Nanoseconds())/1e3,
		r.Batches, r.Throttled.ThrottledPeriods, r.Throttled.Periods, stopped)
}

// InvocationDrain commits a bulk backlog and drains it with one warm
// invocation of the dispatch function.
func InvocationDrain(ctx context.Context, cfg DrainConfig) (DrainResult, error) {
	if cfg.Backlog == 0 {
		cfg.Backlog = 50000
	}
	if cfg.Target == "" {
		cfg.Target = TargetEventBridge
	}
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = TemplateMemoryMB
	}
	res := DrainResult{Target: cfg.Target, MemoryMB: cfg.MemoryMB}
	if cfg.DatabaseURL == "" || cfg.DispatchBinary == "" {
		return res, errors.New("deploybench: InvocationDrain needs DatabaseURL and DispatchBinary")
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("deploybench: connect: %w", err)
	}
	defer pool.Close()

	cfg.Timeout = cmp.Or(cfg.Timeout, TemplateTimeout)
	run := Config{DatabaseURL: cfg.DatabaseURL, Target: cfg.Target, BulkBacklog: true, Timeout: cfg.Timeout}.withDefaults()
	// Both targets answer at once, the webhook with the route's default
	// calls in flight (EventBridge's route leaves it to the default).
	run.TargetLatency, run.RouteConcurrency = 0, 0
	if cfg.Target == TargetWebhook {
		run.RouteConcurrency = route.DefaultConcurrency
	}
	var (
		targetEnv []string
		received  func() int
	)
	if c := cfg.Custom; c != nil {
		res.Target, targetEnv, received = c.Name, c.Env, c.Received
	} else {
		target, env, err := startTarget(run)
		if err != nil {
			return res, err
		}
		defer target.Close()
		targetEnv, received = env, target.Received
	}

	emu, err := lambdaemu.New(lambdaemu.Options{DiscardLogs: true, CPU: cfg.CPU})
	if err != nil {
		return res, err
	}
	defer emu.Close()
	res.CPUShare = emu.CPUShareStatus()
	batches := min(cfg.Backlog/TemplateBatchSize+2, 1000)
	env := append(functionEnv(run, targetEnv),
		// One invocation alone: it starts no workers, returns once drained
		// and may claim the whole backlog.
		"OUTBOX_MAX_WORKERS=1", "OUTBOX_LINGER=off", fmt.Sprintf("OUTBOX_MAX_BATCHES=%d", batches))
	if err := emu.Register(lambdaemu.FunctionConfig{
		Name: dispatchFunction, Binary: cfg.DispatchBinary, Timeout: cfg.Timeout, MemoryMB: cfg.MemoryMB,
		ReservedConcurrency: 1, Env: append(env, cfg.FunctionEnv...),
	}); err != nil {
		return res, err
	}
	// The cold start (configuration, connection) is not the drain's.
	if inv, err := emu.Invoke(dispatchFunction, []byte(`{}`)); err != nil {
		return res, err
	} else if inv.Outcome != lambdaemu.OutcomeSucceeded {
		return res, fmt.Errorf("deploybench: the warm-up invocation %s: %s", inv.Outcome, inv.Response)
	}

	if err := workload.CommitBulkBacklog(ctx, pool, workload.NewLedger(), cfg.Backlog); err != nil {
		return res, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox.pending"); err != nil {
		return res, fmt.Errorf("deploybench: vacuum the backlog: %w", err)
	}
	before, _ := emu.CPUStat(dispatchFunction)
	inv, err := emu.Invoke(dispatchFunction, []byte(`{}`))
	if err != nil {
		return res, err
	}
	if inv.Outcome != lambdaemu.OutcomeSucceeded {
		return res, fmt.Errorf("deploybench: the drain invocation %s: %s", inv.Outcome, inv.Response)
	}
	after, _ := emu.CPUStat(dispatchFunction)
	res.Took, res.CPU, res.Delivered = inv.Duration(), inv.CPU, received()
	res.Throttled = lambdaemu.CPUStat{Periods: after.Periods - before.Periods,
		ThrottledPeriods: after.ThrottledPeriods - before.ThrottledPeriods, ThrottledTime: after.ThrottledTime - before.ThrottledTime}
	var answer dispatch.Summary
	if err := json.Unmarshal(inv.Response, &answer); err != nil {
		return res, fmt.Errorf("deploybench: the drain's answer %s: %w", inv.Response, err)
	}
	res.Batches, res.StoppedBy = answer.Batches, answer.StoppedBy
	// A drain the function's timeout cut short (a slow machine) still
	// measured a steady rate, provided the target received everything the
	// invocation reports delivered (and perhaps a call or two it cut off
	// at the deadline, to be retried): fewer would mean messages lost.
	cutShort := answer.StoppedBy == dispatch.StoppedDeadline && answer.Delivered > 0 && res.Delivered >= answer.Delivered
	if res.Delivered < cfg.Backlog && !cutShort {
		return res, fmt.Errorf("deploybench: one invocation delivered %d of %d messages (answer %s)", res.Delivered, cfg.Backlog, inv.Response)
	}
	return res, nil
}

// TemplateFacts are the dispatch function's settings read from a
// template.yaml.
type TemplateFacts struct {
	// DispatchMemoryMB is the dispatch function's MemorySize (its own, or
	// the Globals' default); DispatchMaxWorkers the parameter's default.
	DispatchMemoryMB, DispatchMaxWorkers int
}

// ReadTemplate reads the dispatch function's memory and workers from the
// SAM template at path.
func ReadTemplate(path string) (TemplateFacts, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return TemplateFacts{}, err
	}
	var tpl struct {
		Parameters map[string]struct {
			Default string `yaml:"Default"`
		} `yaml:"Parameters"`
		Globals struct {
			Function struct {
				MemorySize int `yaml:"MemorySize"`
			} `yaml:"Function"`
		} `yaml:"Globals"`
		Resources struct {
			DispatchFunction struct {
				Properties struct {
					MemorySize int `yaml:"MemorySize"`
				} `yaml:"Properties"`
			} `yaml:"DispatchFunction"`
		} `yaml:"Resources"`
	}
	// Decode through a node: the intrinsics' tags (!Ref, !Sub) would
	// otherwise be refused.
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return TemplateFacts{}, fmt.Errorf("%s: %w", path, err)
	}
	if err := doc.Decode(&tpl); err != nil {
		return TemplateFacts{}, fmt.Errorf("%s: %w", path, err)
	}
	f := TemplateFacts{DispatchMemoryMB: tpl.Resources.DispatchFunction.Properties.MemorySize}
	if f.DispatchMemoryMB == 0 {
		f.DispatchMemoryMB = tpl.Globals.Function.MemorySize
	}
	if f.DispatchMemoryMB == 0 {
		f.DispatchMemoryMB = lambdaemu.DefaultMemoryMB // SAM's default, as Lambda's
	}
	if _, err := fmt.Sscan(tpl.Parameters["DispatchMaxWorkers"].Default, &f.DispatchMaxWorkers); err != nil {
		return f, fmt.Errorf("%s: DispatchMaxWorkers default %q: %w", path, tpl.Parameters["DispatchMaxWorkers"].Default, err)
	}
	return f, nil
}
