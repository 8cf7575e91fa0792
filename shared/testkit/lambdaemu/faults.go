package lambdaemu

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// KillPlan kills environments in the middle of invocations (SIGKILL), as
// a crashed sandbox, an out-of-memory kill or a host failure would.
type KillPlan struct {
	// Probability that an invocation is killed (1: every one).
	Probability float64
	// After and Before bound the moment of the kill, from the start of
	// the invoke phase: uniformly between them (exactly After when Before
	// is not above it).
	After, Before time.Duration
	// Limit stops the plan after that many kills (0: no limit).
	Limit int
}

// killPlan is a KillPlan in force; guarded by Emulator.mu.
type killPlan struct {
	KillPlan
	kills int
}

// InjectKills adds a plan for the function's later invocations.
func (e *Emulator) InjectKills(function string, p KillPlan) error {
	if p.Probability <= 0 || p.Probability > 1 {
		return fmt.Errorf("lambdaemu: a KillPlan's Probability must be in (0, 1], got %g", p.Probability)
	}
	f, err := e.lookup(function)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	f.kills = append(f.kills, &killPlan{KillPlan: p})
	return nil
}

// armKillPlan decides whether the invocation starting now will be
// killed, and arms the kill; the returned function disarms it.
func (e *Emulator) armKillPlan(f *function, env *environment, requestID string) (disarm func()) {
	e.mu.Lock()
	var delay time.Duration
	armed := false
	for _, p := range f.kills {
		if (p.Limit > 0 && p.kills >= p.Limit) || rand.Float64() >= p.Probability {
			continue
		}
		p.kills++
		delay = p.After
		if p.Before > p.After {
			delay += rand.N(p.Before - p.After)
		}
		armed = true
		break
	}
	e.mu.Unlock()
	if !armed {
		return func() {}
	}
	timer := time.AfterFunc(delay, func() { e.killByFault(env, requestID, fmt.Sprintf("planned, %s into the invocation", delay)) })
	return func() { timer.Stop() }
}

// KillBusy kills (SIGKILL) an environment of the function that is
// running an invocation, now, and returns that invocation's request id;
// ok is false when none is running one.
func (e *Emulator) KillBusy(function string) (requestID string, ok bool, err error) {
	f, err := e.lookup(function)
	if err != nil {
		return "", false, err
	}
	e.mu.Lock()
	var victim *environment
	var id *string
	for _, env := range f.envs {
		if id = env.invoking.Load(); env.state == stateBusy && id != nil {
			victim = env
			break
		}
	}
	e.mu.Unlock()
	if victim == nil {
		return "", false, nil
	}
	e.killByFault(victim, *id, "KillBusy")
	return *id, true, nil
}

func (e *Emulator) killByFault(env *environment, requestID, why string) {
	if id := env.invoking.Load(); id == nil || *id != requestID {
		return // the invocation ended before the kill fell due
	}
	env.killedByFault.Store(true)
	env.proc.Kill()
	env.fn.obs.count(func(s *Stats) { s.FaultKills++ })
	e.logf("lambdaemu: %s: environment %d killed during %s (%s)", env.fn.cfg.Name, env.id, requestID, why)
}
