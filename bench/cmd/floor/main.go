// Command floor runs the floor comparison of `make bench-compare` alone:
// the bare-SQL floor and the engine at the same batch and connection count,
// each draining a fresh copy of one template, in adjacent pairs so that the
// machine's drift moves both alike. It is the quick way to measure a change
// to the claim, the completion or the engine against the floor goals
// without the whole comparison.
//
//	go run ./cmd/floor                          # from bench/: 1 and 2 connections, 3 rounds
//	go run ./cmd/floor -clients 2 -rounds 5
//	go run ./cmd/floor -cpuprofile /tmp/fl.pprof  # a CPU profile of the rounds (-tagfocus run=engine: the engine's goroutines)
//	go run ./cmd/floor -memprofile /tmp/fl.alloc  # what the run allocated, by where
//	GOGC=100 go run ./cmd/floor                 # the collector at the runtime's default pace
//
// The process runs its Go collector at the pace the dispatcher's functions
// set at cold start (outboxrun.PaceCollector), unless GOGC is set.
//
// It prints figures, and fails only when a run does not drain its queue.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/cpuprof"
	"github.com/outboxkit/dispatcher/bench/internal/floor"
	"github.com/outboxkit/dispatcher/bench/internal/outboxrun"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		target   = scratch.TargetFlags()
		messages = flag.Int("messages", 200000, "messages in the queue each run drains")
		payload  = flag.Int("payload-bytes", 512, "payload size in bytes")
		batch    = flag.Int("batch", 1000, "batch size of the floor's claims and the engine's BatchSize")
		clients  = flag.String("clients", "1,2", "connection counts, comma-separated: the floor's clients and the engine's dispatchers")
		rounds   = flag.Int("rounds", 3, "rounds; each runs the floor and the engine once per connection count")
		memprof  = flag.String("memprofile", "", "write an allocation profile of the run to this file when it ends")
		profile  = flag.String("cpuprofile", "", "write a CPU profile of the rounds to this file (the floor's client is a small part of it)")
	)
	flag.Parse()
	// The engine runs here as the functions run it (GOGC, when set, wins).
	fmt.Printf("the Go collector at GOGC=%d\n", outboxrun.PaceCollector())
	var counts []int
	for _, f := range strings.Split(*clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-clients: %q is not a positive count", f)
		}
		counts = append(counts, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	srv, stopCluster, err := target.Open(ctx)
	if err != nil {
		return err
	}
	defer stopCluster()
	fmt.Println(target.Describe())
	spec := workload.Spec{Messages: *messages, PayloadBytes: *payload}
	tmpl, err := srv.CreateMigrated(ctx, "floor_template")
	if err != nil {
		return err
	}
	defer tmpl.Drop()
	if _, err := outboxrun.Enqueue(ctx, tmpl, spec, true); err != nil {
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
	fmt.Printf("%d messages of %d bytes, batch %d\n", spec.Messages, spec.PayloadBytes, *batch)
	fmt.Printf("CPU per message: the database's backends (db) and this process (self), whose client is the floor's or the engine's;\n")
	fmt.Printf("scan/msg: entries of pending_claimable the claims' scans returned per message claimed (the rest were skipped: locked by another claim, or a claimed row's old version)\n")
	fmt.Printf("%-5s %-5s %-7s %9s %10s %10s %11s %8s %8s %8s %7s %7s\n", "round", "conns", "run", "msgs/s", "claim p50", "compl p50", "interval/s", "db µs", "self µs", "scan/msg", "ratio", "at p50")
	type best struct{ floor, engine, floorInterval, engineInterval float64 }
	bests := map[int]*best{}
	for round := range *rounds {
		for _, c := range counts {
			b := bests[c]
			if b == nil {
				b = &best{}
				bests[c] = b
			}
			db, err := srv.CreateFrom(ctx, "floor", tmpl.Name)
			if err != nil {
				return err
			}
			stopMeter := db.MeterCPU(ctx)
			f, err := floor.Run(ctx, db, c, *batch)
			fcpu := stopMeter()
			var freads map[string]int64
			if err == nil {
				freads, err = db.IndexReads(ctx, "pending")
			}
			db.Drop()
			if err != nil {
				return err
			}
			fmt.Printf("%-5d %-5d %-7s %9.0f %7.2f ms %7.2f ms %11.0f %8.1f %8.1f %8.2f\n", round+1, c, "floor", f.Rate(), ms(f.ClaimLatency.P50), ms(f.CompleteLatency.P50), f.IntervalRate(),
				perMessage(fcpu.Database, f.Messages), perMessage(fcpu.Self, f.Messages), scanned(freads, f.Messages))

			if db, err = srv.CreateFrom(ctx, "engine", tmpl.Name); err != nil {
				return err
			}
			stopMeter = db.MeterCPU(ctx)
			var e outboxrun.BurnDownResult
			// The engine's goroutines carry the label into the CPU profile:
			// -tagfocus run=engine keeps them alone.
			pprof.Do(ctx, pprof.Labels("run", "engine"), func(ctx context.Context) {
				e, err = outboxrun.BurnDown(ctx, db, outboxrun.BurnDownOptions{BatchSize: *batch, Dispatchers: c})
			})
			ecpu := stopMeter()
			var ereads map[string]int64
			if err == nil {
				ereads, err = db.IndexReads(ctx, "pending")
			}
			db.Drop()
			if err != nil {
				return err
			}
			fmt.Printf("%-5d %-5d %-7s %9.0f %7.2f ms %7.2f ms %11.0f %8.1f %8.1f %8.2f %7.3f %7.3f\n", round+1, c, "engine", e.Rate(), ms(e.ClaimLatency.P50), ms(e.CompleteLatency.P50), e.IntervalRate(),
				perMessage(ecpu.Database, e.Messages), perMessage(ecpu.Self, e.Messages), scanned(ereads, e.Messages), e.Rate()/f.Rate(), e.IntervalRate()/f.IntervalRate())
			b.floor, b.engine = max(b.floor, f.Rate()), max(b.engine, e.Rate())
			b.floorInterval, b.engineInterval = max(b.floorInterval, f.IntervalRate()), max(b.engineInterval, e.IntervalRate())
		}
	}
	if *memprof != "" {
		f, err := os.Create(*memprof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			return err
		}
	}
	for _, c := range counts {
		b := bests[c]
		fmt.Printf("best of each, %d connection(s): engine %.0f, floor %.0f msgs/s: %.3f (at the p50 interval %.3f; the goal is 0.9)\n", c, b.engine, b.floor, b.engine/b.floor, b.engineInterval/b.floorInterval)
	}
	return nil
}

func perMessage(d time.Duration, messages int) float64 {
	return float64(d.Microseconds()) / float64(max(messages, 1))
}

// scanned is the entries of the claim index read per message claimed.
func scanned(reads map[string]int64, messages int) float64 {
	return float64(reads["pending_claimable"]) / float64(max(messages, 1))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
