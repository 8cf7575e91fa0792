package lambdaemu_test

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
)

func TestWarmEnvironmentIsReused(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "probe", lambdaemu.FunctionConfig{})

	first, a1 := invoke(t, e, "probe", `{}`)
	second, a2 := invoke(t, e, "probe", `{}`)
	if !first.ColdStart || second.ColdStart {
		t.Errorf("cold starts: first %v, second %v; want true, false", first.ColdStart, second.ColdStart)
	}
	if a1.PID != a2.PID || a2.Invocations != 2 || second.Environment != first.Environment {
		t.Errorf("second invocation ran in pid %d (its invocation #%d, environment %d), want pid %d's second (environment %d)",
			a2.PID, a2.Invocations, second.Environment, a1.PID, first.Environment)
	}
	if a2.RequestID != second.RequestID {
		t.Errorf("the runtime saw request id %q, the record says %q", a2.RequestID, second.RequestID)
	}
	if s := stats(t, e, "probe"); s.ColdStarts != 1 || s.EnvironmentsStarted != 1 || s.Count(lambdaemu.RequestResponse, lambdaemu.OutcomeSucceeded) != 2 {
		t.Errorf("stats: %+v", s)
	} else if s.MaxInitDuration != first.InitDuration || s.MaxInitDuration <= 0 {
		t.Errorf("the slowest cold start %s, the one cold start's init %s", s.MaxInitDuration, first.InitDuration)
	}
}

func TestTimedOutInvocationIsKilledAndTheNextColdStarts(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "probe", lambdaemu.FunctionConfig{Timeout: 2 * time.Second})

	_, warm := invoke(t, e, "probe", `{}`) // the cold start is not part of the timeout
	slow, _ := invoke(t, e, "probe", `{"sleep_ms": 20000}`)
	if slow.Outcome != lambdaemu.OutcomeTimedOut || slow.ErrorType != "Sandbox.Timedout" || !strings.Contains(string(slow.Response), "Task timed out after 2.00 seconds") {
		t.Fatalf("a 20 s invocation under a 2 s timeout: %s %s %s", slow.Outcome, slow.ErrorType, slow.Response)
	}
	if d := slow.Duration(); d < 2*time.Second || d > 15*time.Second {
		t.Errorf("the timed-out invocation lasted %s, want the 2 s timeout (not the 20 s sleep)", d)
	}
	if err := syscall.Kill(warm.PID, 0); err == nil {
		t.Errorf("process %d still runs after its invocation timed out", warm.PID)
	}
	next, a := invoke(t, e, "probe", `{}`)
	if !next.ColdStart || a.PID == warm.PID || a.Invocations != 1 {
		t.Errorf("after the timeout: cold start %v in pid %d (invocation #%d), want a new environment", next.ColdStart, a.PID, a.Invocations)
	}
	if s := stats(t, e, "probe"); s.Count(lambdaemu.RequestResponse, lambdaemu.OutcomeTimedOut) != 1 || s.EnvironmentsKilled != 1 || s.ColdStarts != 2 {
		t.Errorf("stats: %+v", s)
	}
}

func TestIdleEnvironmentIsShutDown(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "probe", lambdaemu.FunctionConfig{IdleLifetime: 300 * time.Millisecond})

	_, a := invoke(t, e, "probe", `{}`)
	eventually(t, 20*time.Second, "the idle environment's shutdown", func() bool {
		return stats(t, e, "probe").EnvironmentsShutDown == 1
	})
	if err := syscall.Kill(a.PID, 0); err == nil {
		t.Errorf("process %d still runs after its environment was shut down", a.PID)
	}
	if next, _ := invoke(t, e, "probe", `{}`); !next.ColdStart {
		t.Error("an invocation after the shutdown did not cold-start")
	}
}

func TestIdleEnvironmentIsFrozen(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "probe", lambdaemu.FunctionConfig{})

	_, a := invoke(t, e, "probe", `{}`)
	eventually(t, 10*time.Second, "the idle process stopped (state T)", func() bool { return processState(t, a.PID) == "T" })
	if _, again := invoke(t, e, "probe", `{}`); again.PID != a.PID || again.Invocations != 2 {
		t.Errorf("the frozen environment did not run the next invocation: %+v", again)
	}
}

// processState is the state letter of /proc/<pid>/stat (R, S, T, …).
func processState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// pid (comm) state …: comm may hold spaces, so cut after its ")".
	s := string(b)
	rest := s[strings.LastIndexByte(s, ')')+2:]
	return rest[:1]
}

func TestKillPlanKillsMidInvocation(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "probe", lambdaemu.FunctionConfig{})
	_, warm := invoke(t, e, "probe", `{}`)
	if err := e.InjectKills("probe", lambdaemu.KillPlan{Probability: 1, After: 200 * time.Millisecond, Limit: 1}); err != nil {
		t.Fatal(err)
	}
	killed, _ := invoke(t, e, "probe", `{"sleep_ms": 20000}`)
	if killed.Outcome != lambdaemu.OutcomeKilled || killed.ErrorType != "Runtime.ExitError" {
		t.Fatalf("outcome %s %s %s, want killed", killed.Outcome, killed.ErrorType, killed.Response)
	}
	if d := killed.Duration(); d < 200*time.Millisecond || d > 15*time.Second {
		t.Errorf("killed after %s, want about 200ms", d)
	}
	next, a := invoke(t, e, "probe", `{}`) // the plan's limit is spent
	if next.Outcome != lambdaemu.OutcomeSucceeded || !next.ColdStart || a.PID == warm.PID {
		t.Errorf("after the kill: %s, cold start %v, pid %d (killed pid %d)", next.Outcome, next.ColdStart, a.PID, warm.PID)
	}
	if s := stats(t, e, "probe"); s.FaultKills != 1 {
		t.Errorf("FaultKills = %d, want 1", s.FaultKills)
	}
}

func TestKillBusyKillsTheRunningInvocation(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "probe", lambdaemu.FunctionConfig{})
	if _, ok, err := e.KillBusy("probe"); ok || err != nil {
		t.Fatalf("KillBusy with nothing running: %v %v", ok, err)
	}
	id, err := e.InvokeAsync("probe", []byte(`{"sleep_ms": 20000}`))
	if err != nil {
		t.Fatal(err)
	}
	var killedID string
	eventually(t, 20*time.Second, "an invocation to kill", func() bool {
		killedID, _, _ = e.KillBusy("probe")
		return killedID != ""
	})
	waitIdle(t, e, "probe", 20*time.Second)
	invs := invocations(t, e, "probe")
	if killedID != id || len(invs) != 1 || invs[0].Outcome != lambdaemu.OutcomeKilled {
		t.Errorf("killed %s (queued %s): %+v", killedID, id, invs)
	}
}
