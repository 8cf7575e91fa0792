package lambdaemu

import (
	"slices"
	"time"
)

// ThrottledError is a RequestResponse invocation refused for want of
// concurrency: Lambda's 429 TooManyRequestsException.
type ThrottledError struct {
	Function string
	// Reason is Lambda's: ReservedFunctionConcurrentInvocationLimitExceeded
	// or ConcurrentInvocationLimitExceeded.
	Reason string
}

func (e *ThrottledError) Error() string {
	return "lambdaemu: " + e.Function + " throttled: " + e.Reason
}

// acquire gives one invocation an environment, if the concurrency allows:
// the most recently used idle one (warm), else a new one to cold-start.
// Lambda counts a cold-starting environment against the limit too. Every
// acquired environment is released exactly once.
func (e *Emulator) acquire(f *function) (env *environment, cold bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.acquireLocked(f)
}

func (e *Emulator) acquireLocked(f *function) (env *environment, cold bool, err error) {
	if e.closed {
		return nil, false, ErrClosed
	}
	if reserved := f.cfg.ReservedConcurrency; reserved > 0 {
		if f.busy >= reserved {
			return nil, false, &ThrottledError{Function: f.cfg.Name, Reason: "ReservedFunctionConcurrentInvocationLimitExceeded"}
		}
	} else if e.unreservedBusy >= e.opts.AccountConcurrency-e.reserved {
		return nil, false, &ThrottledError{Function: f.cfg.Name, Reason: "ConcurrentInvocationLimitExceeded"}
	}
	if n := len(f.idle); n > 0 {
		env = f.idle[n-1]
		f.idle = f.idle[:n-1]
		env.idleEpoch++
	} else {
		f.nextEnvID++
		env = &environment{emu: e, fn: f, id: f.nextEnvID}
		f.envs = append(f.envs, env)
		cold = true
	}
	env.state = stateBusy
	f.busy++
	if f.cfg.ReservedConcurrency == 0 {
		e.unreservedBusy++
	}
	e.wg.Add(1) // Close waits for the invocation
	f.obs.sample(f.busy, len(f.envs))
	return env, cold, nil
}

// release returns an environment after its invocation: to the idle list
// if it survived, out of the function otherwise (its process already
// ended).
func (e *Emulator) release(env *environment, alive bool) {
	defer e.wg.Done()
	f := env.fn
	e.mu.Lock()
	defer e.mu.Unlock()
	f.busy--
	if f.cfg.ReservedConcurrency == 0 {
		e.unreservedBusy--
	}
	if alive {
		// Kept in the lists even when the emulator is closing, so that
		// Close finds the process and ends it.
		env.state = stateIdle
		f.idle = append(f.idle, env)
		if !e.closed {
			epoch := env.idleEpoch
			time.AfterFunc(f.cfg.IdleLifetime, func() { e.expireIdle(env, epoch) })
		}
	} else {
		env.state = stateEnded
		f.envs = slices.DeleteFunc(f.envs, func(x *environment) bool { return x == env })
	}
	f.obs.sample(f.busy, len(f.envs))
}

// expireIdle shuts an environment down that stayed idle for its
// function's IdleLifetime.
func (e *Emulator) expireIdle(env *environment, epoch int) {
	f := env.fn
	e.mu.Lock()
	if e.closed || env.state != stateIdle || env.idleEpoch != epoch {
		e.mu.Unlock()
		return
	}
	env.state = stateEnded
	f.idle = slices.DeleteFunc(f.idle, func(x *environment) bool { return x == env })
	f.envs = slices.DeleteFunc(f.envs, func(x *environment) bool { return x == env })
	f.obs.sample(f.busy, len(f.envs))
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		env.shutdown()
	}()
}
