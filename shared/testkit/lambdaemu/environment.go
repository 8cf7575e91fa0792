package lambdaemu

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
)

// environmentState is where an environment is in its life; guarded by
// Emulator.mu.
type environmentState int

const (
	// stateBusy: given an invocation (cold-starting or running it).
	stateBusy environmentState = iota
	// stateIdle: warm, frozen, waiting for an invocation.
	stateIdle
	// stateEnded: shut down or killed, out of the function's lists.
	stateEnded
)

// environment is one execution environment: one bootstrap process with
// its own Runtime API endpoint.
type environment struct {
	emu *Emulator
	fn  *function
	id  int

	// proc is set by launch, before the environment can be seen by any
	// other goroutine than the one running its first invocation.
	proc           *lambdatest.Function
	stdout, stderr *lineWriter
	// cpu is the environment's CPU group when the emulator caps CPU; set
	// by launch, then guarded by the function's observations lock.
	cpu *cpuGroup

	// Guarded by Emulator.mu.
	state environmentState
	// idleEpoch changes whenever the environment leaves the idle list,
	// so that a stale idle timer does not shut it down.
	idleEpoch int

	// currentRequest is the invocation the environment last started,
	// for its log lines.
	currentRequest atomic.Pointer[string]
	// invoking is the request id of the invocation the runtime holds now
	// (nil between invocations and during a cold start): what the fault
	// injector may cut short.
	invoking atomic.Pointer[string]
	// killedByFault is set just before the fault injector's SIGKILL, so
	// that the invocation it cuts short is recorded as killed.
	killedByFault atomic.Bool
	endOnce       sync.Once
}

// launch starts the bootstrap process with Lambda's environment.
func (env *environment) launch() error {
	cfg := env.fn.cfg
	vars := []string{
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=" + strconv.Itoa(cfg.MemoryMB),
		"AWS_LAMBDA_LOG_STREAM_NAME=" + env.logStream(),
		"AWS_LAMBDA_INITIALIZATION_TYPE=on-demand",
		"AWS_REGION=" + Region,
		"AWS_DEFAULT_REGION=" + Region,
		"AWS_ENDPOINT_URL_LAMBDA=" + env.emu.endpoint,
	}
	env.stdout = env.newLineWriter("stdout")
	env.stderr = env.newLineWriter("stderr")
	proc, err := lambdatest.LaunchWith(cfg.Binary, cfg.Name, lambdatest.Options{
		Env: append(vars, cfg.Env...), Stdout: env.stdout, Stderr: env.stderr, Freeze: !cfg.NoFreeze,
	})
	if err != nil {
		return fmt.Errorf("lambdaemu: start an environment of %s: %w", cfg.Name, err)
	}
	env.proc = proc
	if st := env.emu.cpu; st.Enabled {
		g, err := newCPUGroup(st, cfg.Name, env.id, cfg.MemoryMB, proc.PID())
		if err != nil {
			proc.Stop()
			return err
		}
		env.cpu = g
	}
	env.fn.obs.count(func(s *Stats) { s.EnvironmentsStarted++ })
	env.emu.logf("lambdaemu: %s: environment %d started (pid %d)", cfg.Name, env.id, proc.PID())
	return nil
}

// logStream names the environment as Lambda names its log stream.
func (env *environment) logStream() string {
	return fmt.Sprintf("%s/[$LATEST]env%08d", time.Now().UTC().Format("2006/01/02"), env.id)
}

// kill ends the process at once (SIGKILL), as Lambda does at a timeout or
// a crash: nothing runs after it.
func (env *environment) kill(reason string) {
	env.end(func() {
		env.proc.Kill()
		env.proc.Stop()
	})
	env.fn.obs.count(func(s *Stats) { s.EnvironmentsKilled++ })
	env.emu.logf("lambdaemu: %s: environment %d killed (%s)", env.fn.cfg.Name, env.id, reason)
}

// shutdown ends an idle environment as Lambda does: SIGTERM, then SIGKILL
// after the grace period.
func (env *environment) shutdown() {
	env.end(func() { env.proc.Shutdown(env.fn.cfg.ShutdownGrace) })
	env.fn.obs.count(func(s *Stats) { s.EnvironmentsShutDown++ })
	env.emu.logf("lambdaemu: %s: idle environment %d shut down", env.fn.cfg.Name, env.id)
}

// stopNow ends the environment when the emulator closes.
func (env *environment) stopNow() {
	env.end(func() { env.proc.Stop() })
}

func (env *environment) end(stop func()) {
	env.endOnce.Do(func() {
		if env.proc != nil {
			stop()
		}
		env.releaseCPUGroup()
		if env.stdout != nil {
			env.stdout.flush()
			env.stderr.flush()
		}
	})
}

// maxMemoryUsedMB reads the process's peak resident set (VmHWM).
func (env *environment) maxMemoryUsedMB() int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", env.proc.PID()))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return (kb + 1023) / 1024
		}
	}
	return 0
}

// processCPU reads the process's user and system CPU time so far
// (/proc/<pid>/stat, in USER_HZ ticks, 100 a second on Linux).
func (env *environment) processCPU() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", env.proc.PID()))
	if err != nil {
		return 0
	}
	// The command name may hold spaces: fields count from after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * (time.Second / 100)
}

func (env *environment) newLineWriter(stream string) *lineWriter {
	return &lineWriter{emit: func(text string) {
		l := LogLine{At: time.Now(), Environment: env.id, Stream: stream, Text: text}
		if id := env.currentRequest.Load(); id != nil {
			l.RequestID = *id
		}
		if env.emu.opts.OnLog != nil {
			env.emu.opts.OnLog(env.fn.cfg.Name, l)
		}
		env.fn.obs.log(l, !env.emu.opts.DiscardLogs)
	}}
}

// lineWriter cuts a process's output into lines.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(text string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.emit(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// flush emits a last line that did not end in a newline.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.emit(string(w.buf))
		w.buf = nil
	}
}
