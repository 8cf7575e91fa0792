// Command lambdashare is `make bench-lambda-share`: the 2-client bare-SQL
// floor and one dispatch bootstrap at the CPU share Lambda gives the
// template's memory size, draining a backlog to EventBridge and to a
// webhook (package bench/internal/lambdashare). Its last line ends
// "ratio R": one invocation's EventBridge rate × DispatchMaxWorkers ÷
// the floor.
//
//	go run ./cmd/lambdashare                # from bench/: a throwaway cluster, autovacuum on
//	go run ./cmd/lambdashare -cluster host  # the server -database-url names instead
//
// The throwaway cluster is every benchmark's (internal/scratch): autovacuum
// on, durable, a managed server's settings; it is stopped and removed at
// the end. Capping the bootstrap needs root and the
// cgroup v1 CPU controller; without them it runs unconstrained and says so.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/lambdashare"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "lambdashare:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		server = scratch.TargetFlags()
		opts   lambdashare.Options
	)
	flag.StringVar(&opts.Template, "template", "../template.yaml", "the SAM template to read the dispatch MemorySize and DispatchMaxWorkers from")
	flag.IntVar(&opts.FloorMessages, "floor-messages", 200000, "messages the floor drains")
	flag.IntVar(&opts.FloorRounds, "floor-rounds", 3, "floor rounds; the best counts")
	flag.IntVar(&opts.Backlog, "backlog", 100000, "messages the invocation drains")
	flag.IntVar(&opts.DrainRounds, "drain-rounds", 3, "drains per target, a fresh database each; the best counts")
	flag.Parse()
	opts.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	srv, stopCluster, err := server.Open(ctx)
	if err != nil {
		return err
	}
	defer stopCluster()
	fmt.Fprintln(os.Stderr, server.Describe())
	began := time.Now()
	res, err := lambdashare.Run(ctx, srv, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "measured in %s\n", time.Since(began).Round(time.Second))
	res.Print(os.Stdout)
	return nil
}
