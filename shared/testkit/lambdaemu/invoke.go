package lambdaemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
)

// request is one invocation to run.
type request struct {
	id      string
	typ     InvocationType
	trigger Trigger
	payload []byte
	queued  time.Time
	attempt int
}

// execute runs one invocation on an environment acquire gave it, records
// it and releases the environment.
func (e *Emulator) execute(f *function, env *environment, cold bool, req request) Invocation {
	inv := Invocation{
		Function: f.cfg.Name, RequestID: req.id, Type: req.typ, Trigger: req.trigger, Attempt: req.attempt,
		Queued: req.queued, Start: time.Now(), Environment: env.id, ColdStart: cold, Payload: req.payload,
	}
	alive := e.run(f, env, cold, req, &inv)
	inv.End = time.Now()
	f.obs.invocation(inv)
	e.release(env, alive)
	return inv
}

// run is the invocation's life: a cold start when the environment is new,
// the event handed to the runtime, the deadline enforced. It reports
// whether the environment survived.
func (e *Emulator) run(f *function, env *environment, cold bool, req request, inv *Invocation) (alive bool) {
	cfg := f.cfg
	if cold {
		initStart := time.Now()
		if err := env.launch(); err != nil {
			inv.Outcome, inv.ErrorType = OutcomeInitFailed, "Runtime.InvalidEntrypoint"
			inv.Response = errorDocument(inv.ErrorType, fmt.Sprintf("RequestId: %s Error: %v", req.id, err))
			env.end(func() {})
			return false
		}
		_, err := env.proc.ColdStart(cfg.InitTimeout)
		inv.InitDuration = time.Since(initStart)
		if err != nil {
			inv.Outcome = OutcomeInitFailed
			var fe *lambdatest.FunctionError
			if errors.As(err, &fe) {
				inv.ErrorType = fe.Type
				inv.Response = errorDocument(fe.Type, fe.Message)
			} else {
				inv.ErrorType = "Runtime.ExitError"
				inv.Response = errorDocument(inv.ErrorType, fmt.Sprintf("RequestId: %s Error: %v", req.id, err))
			}
			env.kill("cold start failed")
			return false
		}
	}
	id := req.id
	env.currentRequest.Store(&id)
	stopFault := e.armKillPlan(f, env, req.id)
	defer stopFault()

	inv.InvokeStart = time.Now()
	deadline := inv.InvokeStart.Add(cfg.Timeout)
	ctx, cancel := context.WithDeadline(e.ctx, deadline)
	env.invoking.Store(&id)
	cpu0 := env.processCPU()
	resp, err := env.proc.InvokeRequest(ctx, lambdatest.Request{ID: req.id, Payload: req.payload, Deadline: deadline})
	env.invoking.Store(nil)
	cancel()
	switch {
	case err == nil && resp.Err == nil:
		inv.Outcome, inv.Response = OutcomeSucceeded, resp.Body
	case err == nil:
		inv.Outcome, inv.ErrorType, inv.Response = OutcomeFunctionError, resp.Err.Type, resp.Body
	case e.ctx.Err() != nil:
		inv.Outcome = OutcomeEmulatorClosed
		env.kill("emulator closed")
		return false
	case errors.Is(err, context.DeadlineExceeded):
		// Lambda stops the runtime at the timeout: whatever the function
		// still had in flight (a batch, a connection) is cut off.
		inv.Outcome, inv.ErrorType = OutcomeTimedOut, "Sandbox.Timedout"
		inv.Response = errorDocument(inv.ErrorType, fmt.Sprintf("RequestId: %s Error: Task timed out after %.2f seconds", req.id, cfg.Timeout.Seconds()))
		env.kill("timed out")
		return false
	default:
		inv.Outcome, inv.ErrorType = OutcomeCrashed, "Runtime.ExitError"
		if env.killedByFault.Load() {
			inv.Outcome = OutcomeKilled
		}
		inv.Response = errorDocument(inv.ErrorType, fmt.Sprintf("RequestId: %s Error: Runtime exited: %v", req.id, err))
		env.kill(string(inv.Outcome))
		return false
	}
	inv.MaxMemoryUsedMB = env.maxMemoryUsedMB()
	inv.CPU = env.processCPU() - cpu0
	return true
}

// errorDocument is the body Lambda answers a failed invocation with.
func errorDocument(errorType, message string) []byte {
	b, _ := json.Marshal(map[string]string{"errorType": errorType, "errorMessage": message})
	return b
}

func newRequestID() string { return uuid.NewString() }

// Invoke runs one RequestResponse invocation from Go, as the Invoke API
// would: a *ThrottledError when no environment is free, a *NotFoundError
// for an unknown function; a function error, timeout or crash is in the
// record's Outcome, not in err.
func (e *Emulator) Invoke(function string, payload []byte) (Invocation, error) {
	f, err := e.lookup(function)
	if err != nil {
		return Invocation{}, err
	}
	return e.invokeSync(f, payload, TriggerDirect)
}

func (e *Emulator) invokeSync(f *function, payload []byte, trigger Trigger) (Invocation, error) {
	env, cold, err := e.acquire(f)
	if err != nil {
		var throttled *ThrottledError
		if errors.As(err, &throttled) {
			f.obs.count(func(s *Stats) { s.SyncThrottles++ })
		}
		return Invocation{}, err
	}
	return e.execute(f, env, cold, request{id: newRequestID(), typ: RequestResponse, trigger: trigger, payload: payload, attempt: 1}), nil
}

// InvokeAsync queues one Event invocation from Go and returns its request
// id, as the Invoke API answers 202.
func (e *Emulator) InvokeAsync(function string, payload []byte) (string, error) {
	f, err := e.lookup(function)
	if err != nil {
		return "", err
	}
	return e.enqueue(f, payload, TriggerDirect)
}
