// Command manykeys runs the many-keys scenario of `make bench-compare`
// alone: keys × per-key ordered messages, interleaved as producers write
// them, against as many unordered messages, each drained by one dispatcher
// to a no-op target from a fresh copy of its template, in adjacent pairs so
// that the machine's drift moves both alike. It is the quick way to measure
// a change to the claim or the completion against the many-keys goal
// without the whole comparison.
//
//	go run ./cmd/manykeys                  # from bench/: 2,000 keys × 25, 3 rounds
//	go run ./cmd/manykeys -keep            # keep the templates, to look at the claim by hand
//	go run ./cmd/manykeys -cpuprofile /tmp/mk.pprof   # a CPU profile of the rounds
//
// It prints figures, and fails only when a run does not deliver every
// message.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/cpuprof"
	"github.com/outboxkit/dispatcher/bench/internal/outboxrun"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "manykeys:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		target  = scratch.TargetFlags()
		keys    = flag.Int("keys", 2000, "ordering keys")
		perKey  = flag.Int("per-key", 25, "messages per key, interleaved with the other keys'")
		payload = flag.Int("payload-bytes", 512, "payload size in bytes")
		batch   = flag.Int("batch", 1000, "the engine's BatchSize")
		rounds  = flag.Int("rounds", 3, "rounds; each drains the keyed and the unordered queue once")
		keep    = flag.Bool("keep", false, "keep the template databases (their names are printed)")
		profile = flag.String("cpuprofile", "", "write a CPU profile of the rounds to this file")
	)
	flag.Parse()
	// The engine runs here as the functions run it (GOGC, when set, wins).
	fmt.Printf("the Go collector at GOGC=%d\n", outboxrun.PaceCollector())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	srv, stopCluster, err := target.Open(ctx)
	if err != nil {
		return err
	}
	defer stopCluster()
	fmt.Println(target.Describe())
	spec := workload.Spec{Messages: *keys * *perKey, PayloadBytes: *payload}
	keyed, err := srv.CreateMigrated(ctx, "manykeys_template")
	if err != nil {
		return err
	}
	plain, err := srv.CreateMigrated(ctx, "unordered_template")
	if err != nil {
		keyed.Drop()
		return err
	}
	if *keep {
		fmt.Printf("template databases: %s (keyed), %s (unordered)\n", keyed.Name, plain.Name)
	} else {
		defer keyed.Drop()
		defer plain.Drop()
	}
	if _, err := outboxrun.EnqueueKeyed(ctx, keyed, spec, *keys); err != nil {
		return err
	}
	if _, err := outboxrun.Enqueue(ctx, plain, spec, true); err != nil {
		return err
	}
	for _, t := range []*scratch.DB{keyed, plain} {
		if err := t.Exec(ctx, "VACUUM ANALYZE outbox.pending", "CHECKPOINT"); err != nil {
			return err
		}
	}
	stopProfile, err := cpuprof.Start(*profile)
	if err != nil {
		return err
	}
	defer stopProfile()
	fmt.Printf("%d keys × %d messages against %d unordered, batch %d\n", *keys, *perKey, spec.Messages, *batch)
	fmt.Printf("%-5s %-9s %9s %10s %10s %8s\n", "round", "queue", "msgs/s", "claim p50", "compl p50", "ratio")
	var best [2]float64
	for round := range *rounds {
		var rates [2]float64
		for i, q := range []struct {
			label string
			tmpl  *scratch.DB
		}{{"unordered", plain}, {"keyed", keyed}} {
			db, err := srv.CreateFrom(ctx, q.label, q.tmpl.Name)
			if err != nil {
				return err
			}
			r, err := outboxrun.BurnDown(ctx, db, outboxrun.BurnDownOptions{BatchSize: *batch, Dispatchers: 1})
			db.Drop()
			if err != nil {
				return err
			}
			rates[i] = r.Rate()
			best[i] = max(best[i], r.Rate())
			ratio := ""
			if i == 1 {
				ratio = fmt.Sprintf("%.3f", rates[1]/rates[0])
			}
			fmt.Printf("%-5d %-9s %9.0f %7.2f ms %7.2f ms %8s\n", round+1, q.label, r.Rate(), ms(r.ClaimLatency.P50), ms(r.CompleteLatency.P50), ratio)
		}
	}
	fmt.Printf("best of each: keyed %.0f, unordered %.0f msgs/s: %.3f (the goal is 0.8)\n", best[1], best[0], best[1]/best[0])
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
