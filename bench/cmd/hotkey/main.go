// Command hotkey runs the hot-key scenario of `make bench-compare` alone:
// one ordering key drained by one dispatcher to a local target of fixed
// latency (the SNS FIFO fake or a webhook server) through the product's own
// publishers, and prints where the run's time went. It is the quick way to
// measure a change to the engine, a publisher or the fake against the
// hot-key goal without the whole comparison.
//
//	go run ./cmd/hotkey                                  # from bench/: SNS FIFO, 5,000 messages, 3 rounds
//	go run ./cmd/hotkey -ordered-run 100,500 -rounds 4   # the run lengths alternate, round by round
//	go run ./cmd/hotkey -cpuprofile /tmp/hot.pprof       # a CPU profile of every round
//
// Each round drains a fresh copy of one template database; with several
// run lengths, each round runs every length once, in turn, so that the
// machine's drift moves them alike. It prints figures, and fails only when
// a run does not deliver every message.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/cpuprof"
	"github.com/outboxkit/dispatcher/bench/internal/outboxrun"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
	"github.com/outboxkit/dispatcher/shared/config"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hotkey:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		server   = scratch.TargetFlags()
		target   = flag.String("target", "sns", "sns (a FIFO topic on the SNS fake) or http (a webhook server)")
		messages = flag.Int("messages", 5000, "messages, over -keys keys")
		keys     = flag.Int("keys", 1, "ordering keys, their messages interleaved: each key a hot key when several")
		payload  = flag.Int("payload-bytes", 512, "payload size in bytes")
		latency  = flag.Duration("latency", 20*time.Millisecond, "each call's latency at the target")
		batch    = flag.Int("batch", 1000, "the engine's BatchSize")
		runs     = flag.String("ordered-run", "0", "comma-separated OrderedRun values to alternate (0: the engine's default)")
		rounds   = flag.Int("rounds", 3, "rounds; each runs every OrderedRun once")
		profile  = flag.String("cpuprofile", "", "write a CPU profile of the rounds to this file")
		keep     = flag.Bool("keep", false, "keep the template database (its name is printed), to look at the claim by hand")
	)
	flag.Parse()
	// The engine runs here as the functions run it (GOGC, when set, wins).
	fmt.Printf("the Go collector at GOGC=%d\n", outboxrun.PaceCollector())
	var lengths []int
	for _, s := range strings.Split(*runs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return fmt.Errorf("-ordered-run: %q is not a run length", s)
		}
		lengths = append(lengths, n)
	}
	newTarget := outboxrun.NewSNSFIFOTarget
	switch *target {
	case "sns":
	case "http":
		newTarget = outboxrun.NewWebhookTarget
	default:
		return fmt.Errorf("-target must be sns or http, got %q", *target)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	srv, stopCluster, err := server.Open(ctx)
	if err != nil {
		return err
	}
	defer stopCluster()
	fmt.Println(server.Describe())
	tgt, err := newTarget(*latency)
	if err != nil {
		return err
	}
	defer tgt.Close()
	tmpl, err := srv.CreateMigrated(ctx, "hotkey_template")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Printf("template database: %s\n", tmpl.Name)
	} else {
		defer tmpl.Drop()
	}
	spec := workload.Spec{Messages: *messages, PayloadBytes: *payload}
	if _, err := outboxrun.EnqueueKeyed(ctx, tmpl, spec, max(*keys, 1)); err != nil {
		return err
	}
	if err := tmpl.Exec(ctx, "VACUUM ANALYZE outbox.pending", "CHECKPOINT"); err != nil {
		return err
	}

	stopProfile, err := cpuprof.Start(*profile)
	if err != nil {
		return err
	}
	defer stopProfile()
	// Each key has at most one call in flight (its next run is claimable
	// only once this one is recorded), so k keys cannot beat k calls per
	// latency.
	bound := float64(max(*keys, 1)*tgt.PerCall) / latency.Seconds()
	best := make([]outboxrun.BurnDownResult, len(lengths))
	fmt.Printf("%d messages on %d key(s) → %s, %s per call of up to %d: the bound is %.0f msgs/s\n", *messages, max(*keys, 1), *target, *latency, tgt.PerCall, bound)
	fmt.Printf("%-5s %-6s %9s %6s %8s %8s %8s %11s %10s %9s %9s %9s\n", "round", "run", "msgs/s", "ratio", "calls%", "beyond%", "between%", "beyond/call", "fake late", "gap p50", "claim p50", "compl p50")
	for round := range *rounds {
		for i, n := range lengths {
			db, err := srv.CreateFrom(ctx, "hotkey", tmpl.Name)
			if err != nil {
				return err
			}
			full := n
			if full == 0 {
				full = config.DefaultOrderedRun
			}
			r, err := outboxrun.BurnDown(ctx, db, outboxrun.BurnDownOptions{
				BatchSize: *batch, Dispatchers: 1, Target: tgt, OrderedRun: n, FullBatch: outboxrun.AnyClaim,
			})
			db.Drop()
			if err != nil {
				return err
			}
			if best[i].Messages == 0 || r.Rate() > best[i].Rate() {
				best[i] = r
			}
			atLatency := time.Duration(r.Calls) * *latency
			beyond := r.Publishing - atLatency
			between := r.Elapsed - r.Publishing
			pct := func(d time.Duration) float64 { return 100 * d.Seconds() / r.Elapsed.Seconds() }
			// The fake's share of beyond: its own time per call past the
			// latency (its timer waking late, its answer); the rest is the
			// client's (our encoding, the SDK's serializer, signer and
			// deserializer, the loopback).
			var late time.Duration
			if r.Served > 0 {
				late = r.Served/time.Duration(max(r.Calls, 1)) - *latency
			}
			fmt.Printf("%-5d %-6d %9.1f %6.3f %7.1f%% %7.1f%% %7.1f%% %8.2f ms %7.2f ms %6.2f ms %6.2f ms %6.2f ms\n", round+1, full,
				r.Rate(), r.Rate()/bound, pct(atLatency), pct(beyond), pct(between),
				ms(beyond/time.Duration(max(r.Calls, 1))), ms(late), ms(r.Gaps.P50), ms(r.ClaimLatency.P50), ms(r.CompleteLatency.P50))
		}
	}
	for i, n := range lengths {
		fmt.Printf("run %d: best %.1f msgs/s, %.3f of the bound\n", n, best[i].Rate(), best[i].Rate()/bound)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
