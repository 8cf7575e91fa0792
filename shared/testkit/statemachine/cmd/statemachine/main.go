// Command statemachine runs the outbox's concurrency invariant harness
// (shared/testkit/statemachine) for as long as asked: many seeds, each a
// fresh migrated database, on the PostgreSQL at $OUTBOX_TEST_DATABASE_URL
// (the host's server) and on a throwaway cluster with autovacuum on
// (shared/localpg), and prints what each seed found.
//
//	make statemachine                                    # 10 seeds x 30 s, on both servers
//	go run ./shared/testkit/statemachine/cmd/statemachine -seed 42 -seeds 1 -cluster host -v
//	go run ./shared/testkit/statemachine/cmd/statemachine -mutant complete-without-fence -keep-going
//
// It exits 1 when an invariant was broken and 2 when a run could not be
// carried out. Every failure prints the seed and the command that replays
// it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/outboxkit/dispatcher/shared/localpg"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/testkit/statemachine"
)

func main() { os.Exit(run()) }

// run is main but for the exit, so that the cluster and the databases are
// removed whatever happens.
func run() int {
	seed := flag.Int64("seed", 0, "the first seed (0: one from the clock)")
	seeds := flag.Int("seeds", 10, "how many seeds, from -seed on")
	steps := flag.Int("steps", 0, "steps per seed (0: no bound but -duration)")
	duration := flag.Duration("duration", 30*time.Second, "schedule per seed (0: no bound but -steps)")
	claimers := flag.Int("claimers", 3, "claimer sessions")
	completers := flag.Int("completers", 3, "completer sessions")
	producers := flag.Int("producers", 3, "producer sessions (one login each)")
	maxLease := flag.Int("max-lease", 3, "the longest lease a claim takes, in seconds")
	cluster := flag.String("cluster", "both", "where to run: host ($OUTBOX_TEST_DATABASE_URL), local (a throwaway cluster with autovacuum on) or both")
	serverURL := flag.String("url", pgtest.URL(), "the host's server (its user must create databases and roles)")
	keepGoing := flag.Bool("keep-going", false, "go on with a seed's schedule after a broken invariant")
	mutant := flag.String("mutant", "", "swap a deliberately broken function in first: "+strings.Join(mutantNames(), ", "))
	prepare := flag.String("prepare", "", "a file of SQL to run as the superuser in each database first")
	verbose := flag.Bool("v", false, "print every step")
	logDir := flag.String("logdir", "", "write each run's every step to a file in this directory (default: a new temporary one)")
	flag.Parse()

	if *seed == 0 {
		*seed = time.Now().UnixNano() % 1_000_000
	}
	var sql []string
	if *mutant != "" {
		m, ok := statemachine.Mutants[*mutant]
		if !ok {
			return fail(fmt.Errorf("no mutant %q: %s", *mutant, strings.Join(mutantNames(), ", ")))
		}
		sql = append(sql, m)
	}
	if *prepare != "" {
		b, err := os.ReadFile(*prepare)
		if err != nil {
			return fail(err)
		}
		sql = append(sql, string(b))
	}
	if *cluster != "host" && *cluster != "local" && *cluster != "both" {
		return fail(fmt.Errorf("-cluster must be host, local or both, not %q", *cluster))
	}

	if *logDir == "" {
		dir, err := os.MkdirTemp("", "statemachine-")
		if err != nil {
			return fail(err)
		}
		*logDir = dir
	} else if err := os.MkdirAll(*logDir, 0o755); err != nil {
		return fail(err)
	}
	fmt.Printf("every step of every run is written to %s\n", *logDir)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	type target struct {
		name   string
		server *statemachine.Server
	}
	var targets []target
	if *cluster != "local" {
		s, err := statemachine.OpenServer(ctx, *serverURL)
		if err != nil {
			return fail(err)
		}
		defer s.Close()
		targets = append(targets, target{"host", s})
	}
	if *cluster != "host" {
		fmt.Println("starting a throwaway cluster with autovacuum on")
		c, err := statemachine.StartCluster(ctx)
		if errors.Is(err, localpg.ErrNotInstalled) {
			return fail(fmt.Errorf("%w: %s", err, localpg.InstallHint))
		}
		if err != nil {
			return fail(err)
		}
		defer c.Stop()
		s, err := statemachine.OpenServer(ctx, c.URL)
		if err != nil {
			return fail(err)
		}
		defer s.Close()
		targets = append(targets, target{"local", s})
	}

	failed := map[string][]int64{}
	broken := map[int]int{}
	runs := 0
	for i := range *seeds {
		for _, t := range targets {
			if ctx.Err() != nil {
				break
			}
			cfg := statemachine.Config{
				Seed: *seed + int64(i), Steps: *steps, Duration: *duration,
				Claimers: *claimers, Completers: *completers, Producers: *producers,
				MaxLeaseSeconds: *maxLease, KeepGoing: *keepGoing,
			}
			if len(sql) > 0 {
				cfg.Prepare = statemachine.PrepareSQL(strings.Join(sql, ";\n"))
			}
			logFile, err := os.Create(filepath.Join(*logDir, fmt.Sprintf("%s-seed%d.log", t.name, cfg.Seed)))
			if err != nil {
				return fail(err)
			}
			cfg.Log = logFile
			if *verbose {
				cfg.Log = io.MultiWriter(logFile, os.Stdout)
			}
			dbURL, drop, err := t.server.NewDatabase(ctx)
			if err != nil {
				return fail(err)
			}
			cfg.AdminURL = dbURL
			fmt.Printf("== %s, seed %d\n", t.name, cfg.Seed)
			rep, err := statemachine.Run(ctx, cfg)
			drop()
			logFile.Close()
			if rep != nil {
				rep.WriteText(os.Stdout)
			}
			if err != nil {
				return fail(err)
			}
			runs++
			if rep.Failed() {
				failed[t.name] = append(failed[t.name], cfg.Seed)
				for inv := range rep.Invariants() {
					broken[inv]++
				}
				fmt.Printf("  replay: go run ./shared/testkit/statemachine/cmd/statemachine -cluster %s -seed %d -seeds 1 %s\n",
					t.name, cfg.Seed, replayFlags(*steps, *duration, *claimers, *completers, *producers, *maxLease, *mutant))
			}
		}
	}

	fmt.Printf("\n%d runs", runs)
	if len(failed) == 0 {
		fmt.Println(": every invariant held")
		return 0
	}
	fmt.Println(":")
	for _, name := range []string{"host", "local"} {
		if len(failed[name]) > 0 {
			fmt.Printf("  %s: invariants broken with seeds %v\n", name, failed[name])
		}
	}
	invs := make([]int, 0, len(broken))
	for inv := range broken {
		invs = append(invs, inv)
	}
	sort.Ints(invs)
	for _, inv := range invs {
		fmt.Printf("  invariant %d broken in %d runs\n", inv, broken[inv])
	}
	return 1
}

func replayFlags(steps int, duration time.Duration, claimers, completers, producers, maxLease int, mutant string) string {
	f := fmt.Sprintf("-steps %d -duration %s -claimers %d -completers %d -producers %d -max-lease %d",
		steps, duration, claimers, completers, producers, maxLease)
	if mutant != "" {
		f += " -mutant " + mutant
	}
	return f
}

func mutantNames() []string {
	var names []string
	for name := range statemachine.Mutants {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "statemachine:", err)
	return 2
}
