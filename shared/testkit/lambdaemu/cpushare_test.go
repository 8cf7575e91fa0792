package lambdaemu_test

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
)

// cpuShareEmulator is an emulator capping environments at Lambda's share,
// or a skip saying why this machine cannot.
func cpuShareEmulator(t *testing.T) *lambdaemu.Emulator {
	t.Helper()
	e := newEmulator(t, lambdaemu.Options{CPU: lambdaemu.CPUShare{Mode: lambdaemu.CPULambdaShare}})
	if st := e.CPUShareStatus(); !st.Enabled {
		t.Skipf("CPU groups unavailable: %s", st)
	}
	return e
}

// TestBootstrapIsCappedAtItsLambdaShare spins a 256 MB probe for 300 ms of
// CPU: Lambda gives it 14.47 ms of every 100 ms, so the kernel must stop
// it (throttled periods) and its CPU over the wall time it took stays near
// the share. Both hold however slow the machine: a slow machine gives the
// probe less CPU, never more, and a spinning process still meets its
// quota in most periods.
func TestBootstrapIsCappedAtItsLambdaShare(t *testing.T) {
	t.Parallel()
	e := cpuShareEmulator(t)
	const memoryMB = 256
	register(t, e, "capped", lambdaemu.FunctionConfig{MemoryMB: memoryMB, Timeout: 5 * time.Minute})

	_, warm := invoke(t, e, "capped", `{}`)
	group := cpuGroupOf(t, warm.PID)
	if !strings.HasPrefix(group, e.CPUShareStatus().Dir+"/") {
		t.Fatalf("pid %d is in CPU group %s, want one inside %s", warm.PID, group, e.CPUShareStatus().Dir)
	}
	mem := float64(memoryMB)
	wantQuota := int(math.Round(mem / lambdaemu.LambdaFullCPUMemoryMB * 100000)) // 14,471 µs
	if q := readInt(t, filepath.Join(group, "cpu.cfs_quota_us")); q != wantQuota {
		t.Errorf("cpu.cfs_quota_us = %d, want %d (256 MB ÷ 1,769 MB of 100,000 µs)", q, wantQuota)
	}
	if p := readInt(t, filepath.Join(group, "cpu.cfs_period_us")); p != 100000 {
		t.Errorf("cpu.cfs_period_us = %d, want 100000", p)
	}

	inv, a := invoke(t, e, "capped", `{"spin_cpu_ms": 300}`)
	if inv.Outcome != lambdaemu.OutcomeSucceeded || a.SpunWallMS == 0 {
		t.Fatalf("spin: %s %s", inv.Outcome, inv.Response)
	}
	// The record's CPU counts in 10 ms ticks, and the spin's 300 ms is at
	// least that.
	if inv.CPU < 280*time.Millisecond {
		t.Errorf("the invocation's record says it used %s of CPU; the probe spun %.0f ms", inv.CPU, a.SpunCPUMS)
	}
	share := float64(wantQuota) / 100000
	// Slack: the spin's own CPU clock ticks coarsely, and a period's
	// quota may be overrun by a scheduler tick before the kernel stops it.
	if limit := share*a.SpunWallMS*1.5 + 30; a.SpunCPUMS > limit {
		t.Errorf("the probe used %.0f ms of CPU in %.0f ms of wall time (%.1f%%), want at most %.0f ms (its %.1f%% share with slack)",
			a.SpunCPUMS, a.SpunWallMS, 100*a.SpunCPUMS/a.SpunWallMS, limit, 100*share)
	}
	st, err := e.CPUStat("capped")
	if err != nil {
		t.Fatal(err)
	}
	if st.ThrottledPeriods == 0 {
		t.Errorf("cpu.stat shows no throttled period over %d periods: the probe was not capped", st.Periods)
	}
	t.Logf("%.0f ms CPU in %.0f ms wall (%.1f%%, share %.1f%%); throttled in %d of %d periods, %s",
		a.SpunCPUMS, a.SpunWallMS, 100*a.SpunCPUMS/a.SpunWallMS, 100*share, st.ThrottledPeriods, st.Periods, st.ThrottledTime)

	e.Close()
	if _, err := os.Stat(group); !os.IsNotExist(err) {
		t.Errorf("the environment's CPU group %s is still there after Close (%v)", group, err)
	}
	if _, err := os.Stat(e.CPUShareStatus().Dir); !os.IsNotExist(err) {
		t.Errorf("the emulator's CPU group %s is still there after Close (%v)", e.CPUShareStatus().Dir, err)
	}
}

// A group left by an emulator whose process died is removed by the next
// emulator that sets up its share.
func TestStaleCPUGroupsAreSwept(t *testing.T) {
	// Not parallel: the sweep it waits for runs in any emulator's New.
	probe := cpuShareEmulator(t)
	root := filepath.Dir(probe.CPUShareStatus().Dir)
	// A pid that is not running: the largest the kernel hands out, plus one.
	stale := filepath.Join(root, "lambdaemu-4194305-test")
	if err := os.MkdirAll(filepath.Join(stale, "fn-env1"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filepath.Join(stale, "fn-env1")); os.Remove(stale) })
	newEmulator(t, lambdaemu.Options{CPU: lambdaemu.CPUShare{Mode: lambdaemu.CPULambdaShare}})
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the dead emulator's group %s is still there (%v)", stale, err)
	}
}

func TestCPUShareOffWithoutCgroups(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{CPU: lambdaemu.CPUShare{Mode: lambdaemu.CPULambdaShare, Root: t.TempDir()}})
	st := e.CPUShareStatus()
	if st.Enabled || !strings.Contains(st.Reason, "no cgroup v1 CPU controller") {
		t.Fatalf("with no CPU controller: %+v", st)
	}
	if !strings.Contains(st.String(), "off") {
		t.Errorf("the report %q does not say the share is off", st)
	}
	register(t, e, "free", lambdaemu.FunctionConfig{})
	if inv, _ := invoke(t, e, "free", `{}`); inv.Outcome != lambdaemu.OutcomeSucceeded {
		t.Errorf("an uncapped invocation: %s %s", inv.Outcome, inv.Response)
	}
	if _, err := lambdaemu.New(lambdaemu.Options{CPU: lambdaemu.CPUShare{Mode: lambdaemu.CPUFixedShare}}); err == nil {
		t.Error("a fixed share of 0 CPUs was accepted")
	}
}

func TestFixedCPUShareSetsItsQuota(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{CPU: lambdaemu.CPUShare{Mode: lambdaemu.CPUFixedShare, CPUs: 0.5}})
	if st := e.CPUShareStatus(); !st.Enabled {
		t.Skipf("CPU groups unavailable: %s", st)
	}
	register(t, e, "half", lambdaemu.FunctionConfig{MemoryMB: 128})
	_, a := invoke(t, e, "half", `{}`)
	if q := readInt(t, filepath.Join(cpuGroupOf(t, a.PID), "cpu.cfs_quota_us")); q != 50000 {
		t.Errorf("cpu.cfs_quota_us = %d, want 50000 (0.5 CPU whatever the memory)", q)
	}
}

// cpuGroupOf is the directory of pid's cgroup v1 CPU group.
func cpuGroupOf(t *testing.T, pid int) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && (parts[1] == "cpu" || strings.Contains(","+parts[1]+",", ",cpu,")) {
			return filepath.Join(lambdaemu.DefaultCgroupCPURoot, parts[2])
		}
	}
	t.Fatalf("pid %d has no cgroup v1 CPU group", pid)
	return ""
}

func readInt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}
