package deploybench_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/testkit/deploybench"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/testkit/workload"
)

// TestSmallRunDeliversEverything runs the driver briefly and checks what
// it counts, never how fast: the figures are for the benchmark.
func TestSmallRunDeliversEverything(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rep, err := deploybench.Run(t.Context(), deploybench.Config{
		DatabaseURL: db.URL, DispatchBinary: lambdatest.Build(t, "dispatch"),
		Rate: 100, Backlog: 300, Duration: 2 * time.Second, Compression: 60, // a tick a second
		// Lingering invocations last their timeout less the safety margin:
		// 5 s here, not the template's minute.
		Timeout: 15 * time.Second,
		Logf:    t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Measurement
	if m.Committed == 0 || m.Received != m.Committed || m.Missing != 0 || m.Unexpected != 0 || m.Latency.N != m.Received {
		t.Errorf("measurement: %+v", m)
	}
	if b := rep.Backlog; b == nil || b.Committed != 300 || b.Received != 300 || b.Unexpected != 0 || b.Took() <= 0 {
		t.Errorf("backlog: %+v", b)
	}
	if rep.Answers.Delivered != m.Committed+300 || rep.Dispatch.Invocations != rep.Ticks+rep.Answers.Workers || rep.Ticks == 0 {
		t.Errorf("%d ticks, %d invocations delivered %d of %d messages", rep.Ticks, rep.Dispatch.Invocations, rep.Answers.Delivered, m.Committed)
	}
	if rep.ClaimCalls < int64(rep.Answers.Batches) {
		t.Errorf("the database counted %d claims, the invocations made %d batches", rep.ClaimCalls, rep.Answers.Batches)
	}
	var out strings.Builder
	rep.Print(&out)
	if !strings.Contains(out.String(), "rate(1 minute) compressed ×60: a tick every 1s") {
		t.Errorf("the report does not say how the schedule was compressed:\n%s", out.String())
	}
	t.Log("\n" + out.String())
}

// TestBulkBacklogDrainsToEventBridge drains a bulk backlog through the
// dispatch function's EventBridge publisher to the local endpoint, and
// ends the run once drained instead of waiting for the lingering
// invocation.
func TestBulkBacklogDrainsToEventBridge(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const backlog = 3000
	rep, err := deploybench.Run(t.Context(), deploybench.Config{
		DatabaseURL: db.URL, DispatchBinary: lambdatest.Build(t, "dispatch"),
		Backlog: backlog, BulkBacklog: true, Target: deploybench.TargetEventBridge, StopWhenDrained: true,
		// The claims may go on for the timeout less the safety margin, 50 s:
		// room for a slow machine's drain, which ends the run as soon as it
		// is done, long before.
		Duration: time.Millisecond, Timeout: time.Minute, Logf: t.Logf,
		// As make bench-compare runs it: each environment at its share.
		CPU: lambdaemu.CPUShare{Mode: lambdaemu.CPULambdaShare},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := rep.CPUShare; s.Requested != lambdaemu.CPULambdaShare || s.Enabled != (s.Reason == "") {
		t.Errorf("the share: %+v", s)
	}
	b := rep.Backlog
	if b == nil || b.Committed != backlog || b.Received != backlog || b.Missing != 0 || b.Unexpected != 0 || rep.Target.Duplicates != 0 {
		t.Fatalf("backlog: %+v, target %+v", b, rep.Target)
	}
	// The scheduled invocation lingers for its deadline less the margin
	// (50 s here) after draining; the run ends before, by ending it.
	if rep.EndedByEmulator != 1 || rep.Elapsed >= rep.Config.Timeout {
		t.Errorf("%d invocations ended by the emulator; the run took %s", rep.EndedByEmulator, rep.Elapsed)
	}
	if rep.CPU.Children <= 0 || rep.CPU.Wall <= 0 {
		t.Errorf("CPU: %+v", rep.CPU)
	}
	var out strings.Builder
	rep.Print(&out)
	for _, want := range []string{"EventBridge route", "in bulk", "ended by the emulator", "bootstraps", "cpu share: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report does not say %q:\n%s", want, out.String())
		}
	}
}

func TestEventBridgeTargetNeedsABulkBacklogAlone(t *testing.T) {
	t.Parallel()
	for _, cfg := range []deploybench.Config{
		{Target: deploybench.TargetEventBridge, Rate: 10, Backlog: 10, BulkBacklog: true},
		{Target: deploybench.TargetEventBridge, Backlog: 10},
		{Target: "sqs"},
	} {
		cfg.DatabaseURL, cfg.DispatchBinary = "postgres://unused", "/nonexistent"
		if _, err := deploybench.Run(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "Target") && !strings.Contains(err.Error(), "EventBridge") {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

// TestInvocationDrainAtTheShare drains a small backlog with one invocation
// capped at the template's memory: everything arrives, the answer's
// batches add up, and the report says whether the cap held. It checks
// counts, never speed.
func TestInvocationDrainAtTheShare(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	res, err := deploybench.InvocationDrain(t.Context(), deploybench.DrainConfig{
		DatabaseURL: db.URL, DispatchBinary: lambdatest.Build(t, "dispatch"), Backlog: 1200,
		CPU: lambdaemu.CPUShare{Mode: lambdaemu.CPULambdaShare},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Delivered != 1200 || res.Batches < 3 || res.Took <= 0 || res.MemoryMB != deploybench.TemplateMemoryMB {
		t.Errorf("drain: %+v", res)
	}
	if res.CPUShare.Enabled != (res.CPUShare.Reason == "") {
		t.Errorf("the share status is inconsistent: %+v", res.CPUShare)
	}
	t.Log(res)
}

// TestInvocationDrainCutShortByItsTimeout is a drain the function's
// timeout ends before the backlog does, as on a machine slower than the
// benchmark's sizing assumed: it reports the rate of what was delivered
// and why it stopped, instead of failing the benchmark.
func TestInvocationDrainCutShortByItsTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// One call at a time, 100 ms each: 10 msgs/s, so 1,200 messages
	// outlast a timeout of 5 s by far on any machine.
	target, err := workload.StartTarget(100 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	routes := fmt.Sprintf(`{"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"http","url":%q,"signing_secret_env":"TARGET_SIGNING_SECRET","concurrency":1}}]}`, target.URL)
	res, err := deploybench.InvocationDrain(t.Context(), deploybench.DrainConfig{
		DatabaseURL: db.URL, DispatchBinary: lambdatest.Build(t, "dispatch"), Backlog: 1200, Timeout: 5 * time.Second,
		FunctionEnv: []string{"OUTBOX_SAFETY_MARGIN=2s"},
		Custom:      &deploybench.CustomTarget{Name: "slow webhook", Env: []string{"OUTBOX_ROUTES=" + routes, "TARGET_SIGNING_SECRET=" + target.Secret}, Received: target.Received},
	})
	if err != nil {
		t.Fatalf("a drain cut short by its timeout failed the benchmark: %v", err)
	}
	if res.StoppedBy != dispatch.StoppedDeadline || res.Delivered == 0 || res.Delivered >= 1200 || res.Rate() <= 0 {
		t.Errorf("drain: %+v, want stopped by the deadline with some of the 1,200 delivered", res)
	}
	if !strings.Contains(res.String(), "stopped by the function's timeout") {
		t.Errorf("the report does not say the timeout stopped it: %s", res)
	}
	t.Log(res)
}
