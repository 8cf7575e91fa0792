// Command callcost runs the server-CPU comparison of `make bench-compare`
// alone (bench/internal/callcost): what PostgreSQL's backend spends per
// message on the engine's claim and completion and on the bare-SQL floor's
// two statements, the two paths taking turns batch by batch on one
// connection. Its ratios hold still where wall-clock comparisons of the
// same calls do not, so it is the quick way to measure a change to
// complete_batch or claim_batch against the floor:
//
//	go run ./cmd/callcost                                 # from bench/: 5 rounds of 50,000 messages
//	go run ./cmd/callcost -complete-sql /tmp/variant.sql  # a CREATE OR REPLACE of complete_batch, run in each copy first
//
// PostgreSQL must run on this machine (the backend's /proc entry is read).
// It prints figures, and fails only when a round does not drain its queue.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/outboxkit/dispatcher/bench/internal/callcost"
	"github.com/outboxkit/dispatcher/bench/internal/outboxrun"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "callcost:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		target      = scratch.TargetFlags()
		messages    = flag.Int("messages", 50000, "messages in the queue each round drains")
		payload     = flag.Int("payload-bytes", 512, "payload size in bytes")
		batch       = flag.Int("batch", 1000, "batch size of both paths' claims")
		rounds      = flag.Int("rounds", 5, "rounds, each on a fresh copy of the queue")
		completeSQL = flag.String("complete-sql", "", "a file of SQL run in each copy before its round (a variant of outbox.complete_batch to measure)")
	)
	flag.Parse()
	var variant string
	if *completeSQL != "" {
		b, err := os.ReadFile(*completeSQL)
		if err != nil {
			return err
		}
		variant = string(b)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	srv, stopCluster, err := target.Open(ctx)
	if err != nil {
		return err
	}
	defer stopCluster()
	fmt.Println(target.Describe())
	tmpl, err := srv.CreateMigrated(ctx, "callcost_template")
	if err != nil {
		return err
	}
	defer tmpl.Drop()
	if _, err := outboxrun.Enqueue(ctx, tmpl, workload.Spec{Messages: *messages, PayloadBytes: *payload}, true); err != nil {
		return err
	}
	if err := tmpl.Exec(ctx, "VACUUM ANALYZE outbox.pending", "CHECKPOINT"); err != nil {
		return err
	}
	rs, err := callcost.Run(ctx, srv, tmpl.Name, *batch, *rounds, variant)
	if err != nil {
		return err
	}
	fmt.Printf("%d messages of %d bytes, batch %d; PostgreSQL's CPU per message, in µs, on the backend serving both paths in turn\n", *messages, *payload, *batch)
	fmt.Printf("%-5s %13s %16s %12s %15s %8s %10s %7s\n", "round", "engine claim", "engine complete", "floor claim", "floor complete", "claim ×", "complete ×", "both ×")
	for i, r := range rs {
		fmt.Printf("%-5d %13.2f %16.2f %12.2f %15.2f %8.3f %10.3f %7.3f\n", i+1,
			r.Engine.PerMessage(r.Engine.Claim), r.Engine.PerMessage(r.Engine.Complete), r.Floor.PerMessage(r.Floor.Claim), r.Floor.PerMessage(r.Floor.Complete),
			r.ClaimRatio(), r.CompleteRatio(), r.Ratio())
	}
	for _, s := range []struct {
		name string
		f    func(callcost.Round) float64
	}{{"claim", callcost.Round.ClaimRatio}, {"complete", callcost.Round.CompleteRatio}, {"both", callcost.Round.Ratio}} {
		sp := callcost.Summarise(rs, s.f)
		fmt.Printf("engine ÷ floor, %-8s median %.3f (%.3f–%.3f over %d rounds)\n", s.name, sp.Median, sp.Min, sp.Max, len(rs))
	}
	return nil
}
