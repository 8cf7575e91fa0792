package outboxrun

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/shared/testkit/deploybench"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
)

// DeploymentOptions are the three runs of the deployment under the Lambda
// emulation (shared/testkit/deploybench), each with the template's
// defaults: Rate msgs/s offered for Duration to a webhook answering after
// Latency; no traffic for Idle; a Backlog drained to an EventBridge
// endpoint answering at once.
type DeploymentOptions struct {
	Rate     float64
	Duration time.Duration
	Latency  time.Duration
	Idle     time.Duration
	Backlog  int
	// Logf hears about progress.
	Logf func(format string, args ...any)
}

// DeploymentResult is what the three runs measured; a run that failed
// leaves its report zero and its error in Errors.
type DeploymentResult struct {
	Options                DeploymentOptions
	Latency, Idle, Backlog deploybench.Report
	Errors                 map[string]error
}

// Deployment run labels, as DeploymentResult.Errors keys.
const (
	DeployLatency = "latency"
	DeployIdle    = "idle"
	DeployBacklog = "backlog drain"
)

// Deployment builds the real dispatch bootstrap and runs it under the
// Lambda emulation three times, each in a fresh migrated database, each
// execution environment at Lambda's CPU share for the template's memory:
//
//   - latency: Rate msgs/s for Duration to a webhook answering after
//     Latency (64 calls in flight); the run ends once every message has
//     arrived, the lingering invocations ended by the emulator;
//   - idle: no traffic for Idle, then until the lingering invocations
//     return by themselves, so that their claims and billed time are
//     whole;
//   - backlog: Backlog messages written in bulk before the first tick,
//     drained to an EventBridge route whose endpoint answers at once, so
//     that the target is not the bottleneck; the run ends once every
//     message has arrived and the fan-out workers have returned.
func Deployment(ctx context.Context, srv *scratch.Server, opts DeploymentOptions) (DeploymentResult, error) {
	res := DeploymentResult{Options: opts, Errors: map[string]error{}}
	binary, err := buildDispatch()
	if err != nil {
		return res, err
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	run := func(label string, cfg deploybench.Config, into *deploybench.Report) {
		db, err := srv.CreateMigrated(ctx, "deploy")
		if err != nil {
			res.Errors[label] = err
			return
		}
		defer db.Drop()
		cfg.DatabaseURL, cfg.DispatchBinary, cfg.Logf = db.URL, binary, logf
		// Each environment at the CPU Lambda gives the template's memory
		// (a cgroup, where the machine allows one; the report says).
		cfg.CPU = lambdaemu.CPUShare{Mode: lambdaemu.CPULambdaShare}
		rep, err := deploybench.Run(ctx, cfg)
		if err == nil {
			err = check(label, rep)
		}
		if err != nil {
			res.Errors[label] = err
			return
		}
		*into = rep
	}
	run(DeployLatency, deploybench.Config{Rate: opts.Rate, Duration: opts.Duration, TargetLatency: opts.Latency, StopWhenDrained: true}, &res.Latency)
	run(DeployIdle, deploybench.Config{Duration: opts.Idle}, &res.Idle)
	run(DeployBacklog, deploybench.Config{
		Backlog: opts.Backlog, BulkBacklog: true, Target: deploybench.TargetEventBridge,
		Duration: time.Millisecond, StopWhenDrained: true,
	}, &res.Backlog)
	return res, nil
}

// check refuses a run whose figures would not mean what they say: a
// message lost, or a function that printed errors.
func check(label string, rep deploybench.Report) error {
	m := rep.Measurement
	if m.Missing > 0 {
		return fmt.Errorf("%s: %d of %d messages never arrived", label, m.Missing, m.Committed)
	}
	if b := rep.Backlog; b != nil && b.Missing > 0 {
		return fmt.Errorf("%s: %d of %d backlog messages never arrived", label, b.Missing, b.Committed)
	}
	if len(rep.ErrorLines) > 0 {
		return fmt.Errorf("%s: the dispatch function printed errors, the first: %s", label, rep.ErrorLines[0])
	}
	return nil
}
