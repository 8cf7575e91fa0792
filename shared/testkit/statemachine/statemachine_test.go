package statemachine_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/localpg"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/testkit/statemachine"
)

var seedFlag = flag.Int64("seed", 0, "play only this schedule seed (to replay a failure)")

// short is the run `make test` makes of each seed: a few seconds of
// schedule, two actors of each kind, leases of one or two seconds.
func short(adminURL string, seed int64) statemachine.Config {
	return statemachine.Config{
		AdminURL: adminURL, Seed: seed, Duration: 4 * time.Second,
		Claimers: 2, Completers: 2, Producers: 2, MaxLeaseSeconds: 2,
	}
}

func play(t *testing.T, cfg statemachine.Config, replay string) *statemachine.Report {
	t.Helper()
	t.Logf("schedule seed %d (replay: %s)", cfg.Seed, replay)
	rep, err := statemachine.Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("seed %d: %v", cfg.Seed, err)
	}
	var b bytes.Buffer
	rep.WriteText(&b)
	t.Log(b.String())
	return rep
}

// The invariants hold through a few seconds of each of a couple of seeded
// schedules on the test server, and of one on a throwaway cluster with
// autovacuum on.
func TestShortRun(t *testing.T) {
	t.Parallel()
	host, local := []int64{1, 2}, int64(3)
	if *seedFlag != 0 {
		host, local = []int64{*seedFlag}, *seedFlag
	}
	for _, seed := range host {
		name := fmt.Sprintf("host/seed=%d", seed)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			rep := play(t, short(db.URL, seed), replayCommand(name, seed))
			if rep.Failed() {
				t.Errorf("seed %d broke the state machine's invariants (replay: %s):\n%s", seed, replayCommand(name, seed), violations(rep))
			}
		})
	}
	name := fmt.Sprintf("autovacuum/seed=%d", local)
	t.Run(name, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		cluster, err := statemachine.StartCluster(ctx)
		if errors.Is(err, localpg.ErrNotInstalled) {
			t.Skipf("no throwaway cluster: %v (%s)", err, localpg.InstallHint)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer cluster.Stop()
		server, err := statemachine.OpenServer(ctx, cluster.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer server.Close()
		dbURL, drop, err := server.NewDatabase(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer drop()
		rep := play(t, short(dbURL, local), replayCommand(name, local))
		if !strings.Contains(rep.Server, "autovacuum on") {
			t.Errorf("the throwaway cluster runs %s, want autovacuum on", rep.Server)
		}
		if rep.Failed() {
			t.Errorf("seed %d broke the state machine's invariants (replay: %s):\n%s", local, replayCommand(name, local), violations(rep))
		}
	})
}

func replayCommand(name string, seed int64) string {
	return fmt.Sprintf("go test ./shared/testkit/statemachine -run 'TestShortRun/%s$' -args -seed %d", name, seed)
}

func violations(rep *statemachine.Report) string {
	var b strings.Builder
	for _, v := range rep.Violations {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	return b.String()
}

// The harness catches a broken state machine: with outbox.pause swapped
// for one that pauses nothing, claims return heads and unordered messages
// of what the operator paused (today's code may also return a paused
// message in a run behind a head of another topic, which this does not
// count).
func TestCatchesAPauseThatPausesNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg := short(db.URL, 11)
	cfg.Prepare = statemachine.PrepareSQL(statemachine.Mutants["pause-records-only"])
	cfg.Weights = map[string]float64{"pause": 5}
	caught := func(v statemachine.Violation) bool {
		return v.Invariant == statemachine.InvPausedClaimed &&
			(strings.Contains(v.Message, "as its key's head") || strings.Contains(v.Message, "unordered"))
	}
	// It stops when caught; the steps are a ceiling, not a measure.
	cfg.StopWhen, cfg.Duration, cfg.Steps = caught, 0, 3000
	rep := play(t, cfg, "")
	if !found(rep, caught) {
		t.Errorf("seed %d: no claim of a paused head or unordered message reported with pause swapped for a no-op:\n%s", cfg.Seed, violations(rep))
	}
}

// The harness catches a completion without a fence: with complete_batch
// wrapped in one that hands every named leased row to the caller first,
// completions sent after their lease expired write.
func TestCatchesACompletionWithoutAFence(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg := short(db.URL, 12)
	cfg.Prepare = statemachine.PrepareSQL(statemachine.Mutants["complete-without-fence"])
	cfg.Weights = map[string]float64{"complete late": 5, "wait for expiry": 3}
	caught := func(v statemachine.Violation) bool {
		return v.Invariant == statemachine.InvStaleWriter && strings.Contains(v.Message, ", sent at ") &&
			strings.Contains(v.Message, " after its lease expired at ")
	}
	// It stops when caught; the steps are a ceiling, not a measure.
	cfg.StopWhen, cfg.Duration, cfg.Steps = caught, 0, 3000
	rep := play(t, cfg, "")
	if !found(rep, caught) {
		t.Errorf("seed %d: no write by a completion sent after its lease expired reported with the fence removed:\n%s", cfg.Seed, violations(rep))
	}
}

// The harness catches the real completion with its fence broken: the
// lease fence fragment swapped for one that checks a lease is live but not
// whose it is, completions by a worker that does not hold the lease write.
func TestCatchesABrokenFence(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	broken, err := statemachine.BrokenFence()
	if err != nil {
		t.Fatal(err)
	}
	cfg := short(db.URL, 13)
	cfg.Prepare = statemachine.PrepareSQL(broken)
	cfg.Weights = map[string]float64{"complete as another worker": 5}
	caught := func(v statemachine.Violation) bool { return v.Invariant == statemachine.InvStaleWriter }
	// It stops when caught; the steps are a ceiling, not a measure.
	cfg.StopWhen, cfg.Duration, cfg.Steps = caught, 0, 3000
	rep := play(t, cfg, "")
	if !found(rep, caught) {
		t.Errorf("seed %d: no outcome by a worker without the lease reported with the fence broken:\n%s", cfg.Seed, violations(rep))
	}
}

func found(rep *statemachine.Report, match func(statemachine.Violation) bool) bool {
	for _, v := range rep.Violations {
		if match(v) {
			return true
		}
	}
	return false
}
