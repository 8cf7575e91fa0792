// Command soak pushes messages through the real dispatch functions while
// it injects faults — SIGKILLed dispatchers, PostgreSQL restarts, a
// failing, slow and throttling target, rolled-back producer transactions —
// then proves what reached the target: nothing lost, duplicates only where
// a fault made them unavoidable, order kept per key. See shared/testkit/soak for
// what is injected and how each figure is counted, and docs/RELIABILITY.md
// for the results.
//
//	make soak                        # 1,000,000 messages, 24 kills, 2 restarts
//	SOAK_MESSAGES=20000 make soak    # smaller; faults scale with SOAK_KILLS etc.
//	go run ./shared/testkit/soak/cmd/soak -quick         # the variant the test suite runs
//	SOAK_POOLER=pgbouncer make soak  # the functions behind PgBouncer (transaction mode)
//
// It runs its own PostgreSQL cluster (initdb into a temporary directory,
// by shared/localpg), so it needs the PostgreSQL 15+ server binaries
// (SOAK_PG_BIN, or initdb on the PATH, or the usual installation
// directories such as /usr/lib/postgresql/<v>/bin). It exits 1 when
// a guarantee was broken and 2 when the run could not be carried out.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/soak"
)

func main() {
	quick := flag.Bool("quick", false, "the quick variant: 20,000 messages, 5 kills, 2 restarts")
	jsonOut := flag.String("json", os.Getenv("SOAK_JSON"), "also write the figures as JSON to this file")
	flag.Parse()

	cfg := soak.DefaultConfig()
	if *quick {
		cfg = soak.QuickConfig()
	}
	if err := fromEnv(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	cfg.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := soak.Run(ctx, cfg)
	if rep != nil {
		rep.WriteText(os.Stdout)
		if *jsonOut != "" {
			b, _ := json.MarshalIndent(rep, "", "  ")
			if werr := os.WriteFile(*jsonOut, b, 0o644); werr != nil {
				fmt.Fprintln(os.Stderr, "soak:", werr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if err := rep.Check(); err != nil {
		os.Exit(1)
	}
}

// fromEnv applies the SOAK_* variables: SOAK_MESSAGES, SOAK_DISPATCHERS,
// SOAK_PRODUCERS, SOAK_KILLS, SOAK_RESTARTS, SOAK_BURSTS, SOAK_TIMEOUT (a Go
// duration), SOAK_PAUSES, SOAK_TAKEOVERS, SOAK_READ_ONLY_TURNS, and
// SOAK_POOLER=pgbouncer (the functions connect through PgBouncer in
// transaction mode, with OUTBOX_DB_POOLER=transaction). With SOAK_MESSAGES alone, the kills and throttle bursts scale
// down with the message count (a kill per 40,000 messages, a burst per
// 33,000; at least 3 kills and 2 bursts).
func fromEnv(cfg *soak.Config) error {
	ints := []struct {
		name string
		dst  *int
	}{
		{"SOAK_MESSAGES", &cfg.Messages}, {"SOAK_DISPATCHERS", &cfg.Dispatchers}, {"SOAK_PRODUCERS", &cfg.Producers},
		{"SOAK_KILLS", &cfg.Kills}, {"SOAK_RESTARTS", &cfg.PGRestarts}, {"SOAK_BURSTS", &cfg.Bursts},
		{"SOAK_PAUSES", &cfg.Pauses}, {"SOAK_TAKEOVERS", &cfg.Takeovers}, {"SOAK_READ_ONLY_TURNS", &cfg.ReadOnlyTurns},
	}
	zeroOK := map[string]bool{"SOAK_KILLS": true, "SOAK_RESTARTS": true, "SOAK_BURSTS": true,
		"SOAK_PAUSES": true, "SOAK_TAKEOVERS": true, "SOAK_READ_ONLY_TURNS": true}
	for _, v := range ints {
		raw := os.Getenv(v.name)
		if raw == "" {
			continue
		}
		n, err := strconv.Atoi(raw)
		if err != nil || n < 0 || (n == 0 && !zeroOK[v.name]) {
			return fmt.Errorf("%s must be a positive whole number, got %q", v.name, raw)
		}
		*v.dst = n
		if v.name == "SOAK_MESSAGES" && os.Getenv("SOAK_KILLS") == "" {
			cfg.Kills = min(cfg.Kills, max(3, n/40_000))
		}
		if v.name == "SOAK_MESSAGES" && os.Getenv("SOAK_BURSTS") == "" {
			cfg.Bursts = min(cfg.Bursts, max(2, n/33_000))
		}
	}
	switch p := os.Getenv("SOAK_POOLER"); p {
	case "", "none", "pgbouncer":
		cfg.Pooler = p
	default:
		return fmt.Errorf("SOAK_POOLER must be pgbouncer or none, got %q", p)
	}
	if raw := os.Getenv("SOAK_TIMEOUT"); raw != "" {
		d, err := time.ParseDuration(raw)
		if err != nil || d <= 0 {
			return fmt.Errorf("SOAK_TIMEOUT must be a Go duration such as 14m, got %q", raw)
		}
		cfg.Timeout = d
	}
	return nil
}
