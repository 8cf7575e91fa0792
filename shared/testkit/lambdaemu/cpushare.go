package lambdaemu

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// LambdaFullCPUMemoryMB is the memory size at which Lambda gives a
// function one full vCPU; below it the CPU is in proportion to memory.
const LambdaFullCPUMemoryMB = 1769

// CPUPeriod is the CFS period of every environment's CPU group: the
// kernel's default, so that a quota reads as a share of 100 ms.
const CPUPeriod = 100 * time.Millisecond

// DefaultCgroupCPURoot is where cgroup v1 mounts its CPU controller.
const DefaultCgroupCPURoot = "/sys/fs/cgroup/cpu"

// CPUShareMode says how much CPU each execution environment gets.
type CPUShareMode int

const (
	// CPUUnlimited runs every bootstrap with the whole machine (default).
	CPUUnlimited CPUShareMode = iota
	// CPULambdaShare caps each environment at MemoryMB ÷ 1,769 MB of one
	// CPU, as Lambda does: the emulation then says what the deployed
	// function can do, not what this machine can.
	CPULambdaShare
	// CPUFixedShare caps each environment at CPUShare.CPUs.
	CPUFixedShare
)

// CPUShare is Options.CPU: each environment's bootstrap process runs in
// its own cgroup v1 CPU group whose CFS quota is its share of CPUPeriod.
// Where the groups cannot be made (not root, no cgroup v1 CPU controller)
// the emulator runs unlimited and CPUShareStatus says why, so that a
// figure taken without the cap never passes for one taken with it.
type CPUShare struct {
	Mode CPUShareMode
	// CPUs is CPUFixedShare's share of one CPU per environment (0.145 is
	// 14.5 ms of every 100 ms).
	CPUs float64
	// Root is the CPU controller's mount (default DefaultCgroupCPURoot).
	Root string
}

// CPUShareStatus is what the emulator applies.
type CPUShareStatus struct {
	// Requested is the mode asked for; Enabled whether environments are
	// capped. Reason says why not when a cap was asked for and is off.
	Requested CPUShareMode
	Enabled   bool
	Reason    string
	// Dir is the emulator's group; each environment gets a group inside.
	Dir string
	// CPUs is CPUFixedShare's share (0 for the other modes).
	CPUs float64
}

// String is one line for a benchmark's report.
func (s CPUShareStatus) String() string {
	switch {
	case s.Enabled && s.Requested == CPULambdaShare:
		return fmt.Sprintf("cpu share: Lambda's (memory ÷ %d MB of one CPU per environment, cgroup %s)", LambdaFullCPUMemoryMB, s.Dir)
	case s.Enabled:
		return fmt.Sprintf("cpu share: %.3f CPU per environment (cgroup %s)", s.CPUs, s.Dir)
	case s.Requested == CPUUnlimited:
		return "cpu share: off (unlimited: each environment may use the whole machine)"
	default:
		return "cpu share: off, unlimited (" + s.Reason + ")"
	}
}

// CPUStat sums the CFS bandwidth counters (cpu.stat) of a function's
// environments: periods in which one ran, periods in which it used up its
// quota and was stopped, and the time it spent stopped.
type CPUStat struct {
	Periods, ThrottledPeriods int64
	ThrottledTime             time.Duration
}

func (s *CPUStat) add(o CPUStat) {
	s.Periods += o.Periods
	s.ThrottledPeriods += o.ThrottledPeriods
	s.ThrottledTime += o.ThrottledTime
}

// QuotaFor is an environment's CFS quota per CPUPeriod under s, or 0 for
// no cap.
func (s CPUShareStatus) QuotaFor(memoryMB int) time.Duration {
	if !s.Enabled {
		return 0
	}
	share := s.CPUs
	if s.Requested == CPULambdaShare {
		share = float64(memoryMB) / LambdaFullCPUMemoryMB
	}
	q := time.Duration(math.Round(share*float64(CPUPeriod.Microseconds()))) * time.Microsecond
	// The kernel refuses quotas under 1 ms.
	return max(q, time.Millisecond)
}

// setUpCPUShare makes the emulator's group, or says why it cannot.
func setUpCPUShare(c CPUShare) (CPUShareStatus, error) {
	st := CPUShareStatus{Requested: c.Mode}
	switch c.Mode {
	case CPUUnlimited:
		return st, nil
	case CPULambdaShare:
	case CPUFixedShare:
		if !(c.CPUs > 0) || c.CPUs > 1024 {
			return st, fmt.Errorf("lambdaemu: CPUFixedShare needs CPUs between 0 and 1024, got %v", c.CPUs)
		}
		st.CPUs = c.CPUs
	default:
		return st, fmt.Errorf("lambdaemu: unknown CPU share mode %d", c.Mode)
	}
	root := c.Root
	if root == "" {
		root = DefaultCgroupCPURoot
	}
	if _, err := os.Stat(filepath.Join(root, "cpu.cfs_quota_us")); err != nil {
		st.Reason = fmt.Sprintf("no cgroup v1 CPU controller at %s", root)
		return st, nil
	}
	sweepCPUGroups(root)
	dir, err := os.MkdirTemp(root, fmt.Sprintf("lambdaemu-%d-", os.Getpid()))
	if err != nil {
		st.Reason = fmt.Sprintf("cannot create a CPU group under %s: %v", root, err)
		if os.Geteuid() != 0 {
			st.Reason = fmt.Sprintf("%s is not writable: not root (%v)", root, err)
		}
		return st, nil
	}
	st.Enabled, st.Dir = true, dir
	return st, nil
}

// cpuGroup is one environment's CPU group.
type cpuGroup struct{ dir string }

// newCPUGroup makes the group for environment id of fn and moves pid into
// it. The process has just been exec'd: the microseconds before the move
// are the only CPU it gets uncapped.
func newCPUGroup(st CPUShareStatus, fn string, id, memoryMB, pid int) (*cpuGroup, error) {
	g := &cpuGroup{dir: filepath.Join(st.Dir, fmt.Sprintf("%s-env%d", fn, id))}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("lambdaemu: create the CPU group of %s environment %d: %w", fn, id, err)
	}
	writes := [][2]string{
		{"cpu.cfs_period_us", strconv.FormatInt(CPUPeriod.Microseconds(), 10)},
		{"cpu.cfs_quota_us", strconv.FormatInt(st.QuotaFor(memoryMB).Microseconds(), 10)},
		{"cgroup.procs", strconv.Itoa(pid)},
	}
	for _, w := range writes {
		if err := os.WriteFile(filepath.Join(g.dir, w[0]), []byte(w[1]), 0); err != nil {
			g.remove()
			return nil, fmt.Errorf("lambdaemu: CPU group of %s environment %d: write %s: %w", fn, id, w[0], err)
		}
	}
	return g, nil
}

// stat reads the group's cpu.stat.
func (g *cpuGroup) stat() (CPUStat, error) {
	return readCPUStat(filepath.Join(g.dir, "cpu.stat"))
}

// remove deletes the group once its process is gone; the kernel refuses
// (EBUSY) while a task is still in it, e.g. a process not yet reaped.
func (g *cpuGroup) remove() error {
	var err error
	for range 50 {
		if err = os.Remove(g.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

func readCPUStat(path string) (CPUStat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return CPUStat{}, err
	}
	var s CPUStat
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "nr_periods":
			s.Periods = n
		case "nr_throttled":
			s.ThrottledPeriods = n
		case "throttled_time":
			s.ThrottledTime = time.Duration(n)
		}
	}
	return s, nil
}

// CPUShareStatus says whether environments are capped, and why not.
func (e *Emulator) CPUShareStatus() CPUShareStatus { return e.cpu }

// CPUStat sums the cpu.stat counters of the function's environments, live
// and ended; zero when environments are not capped.
func (e *Emulator) CPUStat(function string) (CPUStat, error) {
	f, err := e.lookup(function)
	if err != nil {
		return CPUStat{}, err
	}
	e.mu.Lock()
	envs := append([]*environment(nil), f.envs...)
	e.mu.Unlock()
	// The observations' lock orders this read against an environment's
	// end, which moves its counters from the live group into the stats.
	f.obs.mu.Lock()
	defer f.obs.mu.Unlock()
	s := f.obs.stats.CPU
	for _, env := range envs {
		if env.cpu != nil {
			if live, err := env.cpu.stat(); err == nil {
				s.add(live)
			}
		}
	}
	return s, nil
}

// releaseCPUGroup moves the ended environment's counters into its
// function's stats and removes its group.
func (env *environment) releaseCPUGroup() {
	o := env.fn.obs
	o.mu.Lock()
	g := env.cpu
	env.cpu = nil
	if g != nil {
		if st, err := g.stat(); err == nil {
			o.stats.CPU.add(st)
		}
	}
	o.mu.Unlock()
	if g != nil {
		if err := g.remove(); err != nil {
			env.emu.logf("lambdaemu: %s: remove the CPU group of environment %d: %v", env.fn.cfg.Name, env.id, err)
		}
	}
}

// removeDir removes the emulator's group once its environments' groups
// are gone.
func (s CPUShareStatus) removeDir() error {
	if !s.Enabled {
		return nil
	}
	return (&cpuGroup{dir: s.Dir}).remove()
}

// sweepCPUGroups removes the groups of emulators whose process is gone (a
// benchmark killed before Close): the kernel keeps an empty group until
// it is removed. A group that still holds a process stays.
func sweepCPUGroups(root string) {
	dirs, _ := filepath.Glob(filepath.Join(root, "lambdaemu-*-*"))
	for _, dir := range dirs {
		pid, err := strconv.Atoi(strings.Split(filepath.Base(dir), "-")[1])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		envs, _ := filepath.Glob(filepath.Join(dir, "*-env*"))
		for _, env := range envs {
			os.Remove(env)
		}
		os.Remove(dir)
	}
}
