package gate_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/gate"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// A breaker opens at its threshold of consecutive failures, holds until
// its cool-down, hands its probe to exactly one of several concurrent
// callers, re-opens when the probe fails and closes when it succeeds.
func TestBreakerOpensProbesAndCloses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	s := gate.NewStore(db.Pool)
	const target = "http:https://example.test/hook"
	coolDown := time.Second
	record := func(worker string, ok bool, failures int) gate.State {
		t.Helper()
		st, err := s.Record(ctx, worker, []gate.Outcome{{Target: target, Succeeded: ok, Failures: failures,
			Threshold: 3, CoolDown: coolDown, LastError: "TARGET_5XX: 503"}})
		if err != nil {
			t.Fatal(err)
		}
		return st[target]
	}
	ask := func(worker string) gate.Grant {
		t.Helper()
		g, err := s.Gate(ctx, worker, []gate.Ask{{Target: target, Wanted: 10, CoolDown: coolDown}})
		if err != nil {
			t.Fatal(err)
		}
		return g[target]
	}
	if g := ask("w1"); g.Granted != 10 || g.State != gate.Closed {
		t.Fatalf("a new target: %+v, want all 10 granted, closed", g)
	}
	if st := record("w1", false, 2); st.Open {
		t.Fatal("opened below the threshold")
	}
	// A success in between resets the count: 1 failure after it.
	if st := record("w1", true, 1); st.Open {
		t.Fatal("opened although a success broke the run of failures")
	}
	if st := record("w2", false, 2); !st.Open || st.ProbeAt.IsZero() {
		t.Fatalf("3 consecutive failures across workers: %+v, want open", st)
	}
	g := ask("w1")
	if g.Granted != 0 || g.State != gate.Open || g.RetryAt.IsZero() || g.LastError == "" {
		t.Fatalf("open breaker: %+v, want nothing granted until the probe", g)
	}
	open, err := gate.OpenBreakers(ctx, db.Pool)
	if err != nil || len(open) != 1 || open[0].Target != target || open[0].LastError != "TARGET_5XX: 503" {
		t.Fatalf("open breakers = %+v, %v", open, err)
	}
	time.Sleep(time.Until(g.RetryAt) + 10*time.Millisecond)

	// After the cool-down, of 8 concurrent callers exactly one probes.
	var mu sync.Mutex
	probes, granted := 0, 0
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			g, err := s.Gate(ctx, "c"+string(rune('a'+i)), []gate.Ask{{Target: target, Wanted: 10, CoolDown: coolDown}})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			granted += g[target].Granted
			if g[target].State == gate.Probe {
				probes++
			}
		})
	}
	wg.Wait()
	if probes != 1 || granted != 1 {
		t.Fatalf("%d probes granting %d messages, want exactly 1 probe of 1 message", probes, granted)
	}
	// The probe fails (recorded by a worker that did not win it: no
	// change), then by... its winner is one of c*; find it by state.
	open, _ = gate.OpenBreakers(ctx, db.Pool)
	before := open[0].NextProbe
	if st := record("someone-else", false, 1); !st.Open || !st.ProbeAt.Equal(before) {
		t.Fatalf("a late failure from another worker moved the probe: %+v (was %v)", st, before)
	}
	if st := record("someone-else", true, 0); st.Open {
		t.Fatal("a success did not close the breaker")
	}
	if g := ask("w1"); g.Granted != 10 || g.State != gate.Closed {
		t.Fatalf("closed again: %+v", g)
	}
}

// A failed probe re-opens the breaker for another cool-down.
func TestFailedProbeReopens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	s := gate.NewStore(db.Pool)
	const target = "lambda:f"
	out := gate.Outcome{Target: target, Failures: 1, Threshold: 1, CoolDown: time.Second, LastError: "TIMEOUT"}
	st, err := s.Record(ctx, "w", []gate.Outcome{out})
	if err != nil || !st[target].Open {
		t.Fatalf("%+v %v", st, err)
	}
	time.Sleep(time.Until(st[target].ProbeAt) + 10*time.Millisecond)
	g, err := s.Gate(ctx, "p", []gate.Ask{{Target: target, Wanted: 3, CoolDown: time.Second}})
	if err != nil || g[target].State != gate.Probe {
		t.Fatalf("%+v %v", g, err)
	}
	failedAt := time.Now()
	st, err = s.Record(ctx, "p", []gate.Outcome{out})
	if err != nil || !st[target].Open || st[target].ProbeAt.Before(failedAt.Add(900*time.Millisecond)) {
		t.Fatalf("after a failed probe: %+v %v, want open for another cool-down", st, err)
	}
}

// The bucket never grants more than its second's worth plus what it
// refilled, whatever the callers' number.
func TestRateLimitGrantsAtMostTheRate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	s := gate.NewStore(db.Pool)
	const target, rate = "sns:arn", 50
	start := time.Now()
	var mu sync.Mutex
	granted := 0
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for range 20 {
				g, err := s.Gate(ctx, "w"+string(rune('0'+w)), []gate.Ask{{Target: target, Wanted: 25, PerSecond: rate}})
				if err != nil {
					t.Error(err)
					return
				}
				if g[target].Granted < 25 && g[target].RetryAt.IsZero() {
					t.Error("held messages without a retry time")
				}
				mu.Lock()
				granted += g[target].Granted
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	if max := rate + int(elapsed*rate) + 1; granted > max {
		t.Fatalf("granted %d in %.2fs, more than the bucket's %d", granted, elapsed, max)
	}
	if granted < rate {
		t.Fatalf("granted %d, less than the full bucket of %d", granted, rate)
	}
}

// The functions refuse malformed calls, for callers in other languages.
func TestGateRefusesMalformedCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for _, q := range []string{
		`SELECT * FROM outbox.gate_targets('', ARRAY['a'], ARRAY[1], ARRAY[NULL::int], ARRAY[NULL::int])`,
		`SELECT * FROM outbox.gate_targets('w', ARRAY['a'], ARRAY[1, 2], ARRAY[NULL::int], ARRAY[NULL::int])`,
		`SELECT * FROM outbox.gate_targets('w', ARRAY['a'], ARRAY[1], ARRAY[5], ARRAY[NULL::int])`,
		`SELECT * FROM outbox.gate_targets('w', ARRAY['a'], ARRAY[1], ARRAY[NULL::int], ARRAY[0])`,
		`SELECT * FROM outbox.record_target_outcomes('w', ARRAY['a'], ARRAY[true], ARRAY[-1], ARRAY[1], ARRAY[1000], ARRAY['e'])`,
		`SELECT * FROM outbox.record_target_outcomes('w', ARRAY['a'], ARRAY[true], ARRAY[0], ARRAY[0], ARRAY[1000], ARRAY['e'])`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err == nil {
			t.Errorf("%s: accepted", q)
		}
	}
}
