// Command compare runs the outbox dispatcher's comparison with River,
// watermill-sql and the bare-SQL floor on one PostgreSQL server, prints one
// table of every figure, and writes docs/BENCHMARKS.md and its plot.
//
//	go run ./cmd/compare                 # from bench/: the full run
//	go run ./cmd/compare -quick          # a smaller run, written to $TMPDIR/outbox-bench-quick
//
// It is a program that prints figures, never a test: nothing here fails on
// a slow machine, only on a broken one.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/lambdashare"
	"github.com/outboxkit/dispatcher/bench/internal/report"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/suite"
)

const plotFile = "benchmarks.png"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func run() error {
	quickDefault, _ := strconv.ParseBool(os.Getenv("BENCH_QUICK"))
	var (
		server   = scratch.TargetFlags()
		quick    = flag.Bool("quick", quickDefault, "a smaller, faster run (env BENCH_QUICK)")
		messages = flag.Int("messages", envInt("BENCH_MESSAGES", 0), "messages per system (env BENCH_MESSAGES; default 200000, quick 20000)")
		payload  = flag.Int("payload-bytes", envInt("BENCH_PAYLOAD_BYTES", 0), "payload size in bytes (env BENCH_PAYLOAD_BYTES; default 512)")
		docs     = flag.String("docs", os.Getenv("BENCH_DOCS"), "directory for BENCHMARKS.md and the plot (env BENCH_DOCS; default ../docs, or $TMPDIR/outbox-bench-quick for a quick run)")
	)
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	srv, stopCluster, err := server.Open(ctx)
	if err != nil {
		return err
	}
	defer stopCluster()
	cfg := suite.Defaults(srv.AdminURL, *quick)
	cfg.Cluster = server.Describe()
	if *messages > 0 {
		cfg.Spec.Messages = *messages
	}
	if *payload > 0 {
		if *payload < 128 {
			return fmt.Errorf("-payload-bytes must be at least 128, got %d", *payload)
		}
		cfg.Spec.PayloadBytes = *payload
	}
	dir := *docs
	if dir == "" {
		dir = "../docs"
		if cfg.Quick {
			dir = filepath.Join(os.TempDir(), "outbox-bench-quick")
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	res, err := suite.Run(ctx, cfg, os.Stderr)
	if err != nil {
		return err
	}
	// Lambda's CPU share (make bench-lambda-share) on the same server: the
	// template's workers at their share against the floor.
	shareOpts := lambdashare.Options{Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "lambda share: "+format+"\n", args...) }}
	if cfg.Quick {
		shareOpts.FloorMessages, shareOpts.Backlog = 20000, 20000
	}
	share, err := lambdashare.Run(ctx, srv, shareOpts)
	if err != nil {
		return err
	}
	// make bench-compare passes the time it started, before the build.
	if sec, err := strconv.ParseInt(os.Getenv("BENCH_MAKE_STARTED"), 10, 64); err == nil && sec > 0 {
		res.WallClock = time.Since(time.Unix(sec, 0))
	}
	fmt.Println()
	report.Table(os.Stdout, res)
	fmt.Println()
	share.Print(os.Stdout)
	if err := report.Plot(res, filepath.Join(dir, plotFile)); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	md := filepath.Join(dir, "BENCHMARKS.md")
	if err := os.WriteFile(md, []byte(withSection(report.Markdown(res, plotFile), share.Markdown())), 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s and %s\n", md, filepath.Join(dir, plotFile))
	return nil
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// withSection puts section after the deployment's, before the engine's
// profile, or at the end when that heading is gone.
func withSection(md, section string) string {
	const next = "## Where the engine's time goes"
	if i := strings.Index(md, next); i >= 0 {
		return md[:i] + section + md[i:]
	}
	return md + "\n" + section
}
