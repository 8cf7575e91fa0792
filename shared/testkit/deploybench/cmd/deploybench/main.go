// Command deploybench runs the serverless deployment under the Lambda
// emulation at an offered rate and prints what it measured (package
// shared/testkit/deploybench): the commit-to-receipt latency of every
// message, the throughput, the claims per second. It creates a scratch
// database on the server -database-url names (by default the test server,
// OUTBOX_TEST_DATABASE_URL) and drops it.
//
//	go run ./shared/testkit/deploybench/cmd/deploybench [-rate 1000] [-duration 60s] [-compression 1] …
//	go run ./shared/testkit/deploybench/cmd/deploybench -rate 0 -duration 1s -backlog 200000 -bulk-backlog -target eventbridge -stop-when-drained
//
// After the run it drains -invocation-drain messages with one invocation,
// unconstrained and at the CPU share Lambda gives the template's
// MemorySize (a cgroup; root only, else it says it ran unconstrained).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/deploybench"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/testkit/workload"
)

func main() {
	var (
		cfg      deploybench.Config
		env      string
		jsonPath string
		server   string
		drain    int
		tplPath  string
	)
	flag.Float64Var(&cfg.Rate, "rate", 1000, "offered messages per second (0: none)")
	flag.IntVar(&cfg.MessagesPerTx, "tx", 5, "messages per producer transaction")
	flag.IntVar(&cfg.Backlog, "backlog", 0, "messages committed before the schedule starts, whose drain is measured apart")
	flag.DurationVar(&cfg.Duration, "duration", time.Minute, "how long the producers run")
	flag.BoolVar(&cfg.BulkBacklog, "bulk-backlog", false, "write the backlog with INSERT ... SELECT (fast; its payloads carry their ids) instead of EnqueueBatch")
	flag.StringVar(&cfg.Target, "target", deploybench.TargetWebhook, "the route's target: webhook, or eventbridge (a local endpoint answering at once; needs -rate 0 -bulk-backlog)")
	flag.DurationVar(&cfg.TargetLatency, "latency", 0, "the webhook target's time per call (default 20ms)")
	flag.IntVar(&cfg.RouteConcurrency, "route-concurrency", 0, "the route's calls in flight (default 64 for the webhook, the route's default for eventbridge)")
	flag.BoolVar(&cfg.StopWhenDrained, "stop-when-drained", false, "end the lingering invocations once every message arrived and the fan-out workers returned, instead of waiting for their deadline")
	flag.StringVar(&cfg.Schedule, "schedule", deploybench.TemplateSchedule, "the dispatch schedule (a rate expression)")
	flag.Float64Var(&cfg.Compression, "compression", 1, "how many times faster than real time the schedule ticks (lingering invocations outlast a compressed tick)")
	flag.DurationVar(&cfg.Timeout, "timeout", deploybench.TemplateTimeout, "the dispatch function's timeout")
	flag.IntVar(&cfg.ReservedConcurrency, "reserved-concurrency", deploybench.TemplateMaxWorkers, "the dispatch function's reserved concurrency (the template's DispatchMaxWorkers)")
	flag.StringVar(&env, "env", "", "extra dispatch function variables, KEY=VALUE,KEY=VALUE (override the template's)")
	flag.StringVar(&server, "database-url", pgtest.URL(), "PostgreSQL superuser URL (it creates and drops a scratch database)")
	flag.StringVar(&jsonPath, "json", "", "also write the report as JSON to this file")
	flag.IntVar(&drain, "invocation-drain", 20000, "after the run, drain this backlog with one invocation, unconstrained and at the template's memory's CPU share, and print both (0: skip)")
	flag.StringVar(&tplPath, "template", "template.yaml", "the SAM template whose dispatch MemorySize the capped drain uses")
	cpuShare := flag.Bool("cpu-share", true, "run each execution environment at the CPU Lambda gives its memory (a cgroup v1 CPU group; needs root, else the run is unconstrained and says so)")
	flag.Parse()
	if *cpuShare {
		cfg.CPU = lambdaemu.CPUShare{Mode: lambdaemu.CPULambdaShare}
	}
	if env != "" {
		cfg.FunctionEnv = strings.Split(env, ",")
	}
	cfg.Logf = log.Printf

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, server, jsonPath); err != nil {
		log.Fatal(err)
	}
	if drain > 0 {
		if err := invocationDrains(ctx, server, tplPath, drain); err != nil {
			log.Fatal(err)
		}
	}
}

// invocationDrains prints one invocation's drain of a backlog without a
// CPU cap and at the template's memory size's share of a CPU, as Lambda
// gives it: the unconstrained figure is this machine's, the capped one the
// deployment's.
func invocationDrains(ctx context.Context, server, tplPath string, backlog int) error {
	tpl, err := deploybench.ReadTemplate(tplPath)
	if err != nil {
		return err
	}
	binary, err := lambdatest.BuildBinary("dispatch")
	if err != nil {
		return err
	}
	fmt.Printf("\nper-invocation drain of %d messages to an EventBridge endpoint answering at once (template MemorySize %d MB):\n", backlog, tpl.DispatchMemoryMB)
	for _, mode := range []lambdaemu.CPUShareMode{lambdaemu.CPUUnlimited, lambdaemu.CPULambdaShare} {
		db, err := workload.CreateDatabase(ctx, server, "outbox_deploybench")
		if err != nil {
			return err
		}
		res, err := deploybench.InvocationDrain(ctx, deploybench.DrainConfig{
			DatabaseURL: db.URL, DispatchBinary: binary, Backlog: backlog, MemoryMB: tpl.DispatchMemoryMB,
			CPU: lambdaemu.CPUShare{Mode: mode},
		})
		db.Drop()
		if err != nil {
			return err
		}
		fmt.Printf("  %s\n", res)
		if mode != lambdaemu.CPUUnlimited && !res.CPUShare.Enabled {
			fmt.Printf("  (not capped: %s)\n", res.CPUShare)
		}
	}
	return nil
}

func run(ctx context.Context, cfg deploybench.Config, server, jsonPath string) error {
	binary, err := lambdatest.BuildBinary("dispatch")
	if err != nil {
		return err
	}
	db, err := workload.CreateDatabase(ctx, server, "outbox_deploybench")
	if err != nil {
		return err
	}
	defer db.Drop()
	cfg.DatabaseURL, cfg.DispatchBinary = db.URL, binary

	rep, err := deploybench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	rep.Print(os.Stdout)
	if jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(jsonPath, b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", jsonPath, err)
		}
	}
	return nil
}
