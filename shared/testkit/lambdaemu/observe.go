package lambdaemu

import (
	"maps"
	"math"
	"slices"
	"sync"
	"time"
)

// InvocationType is how an invocation was asked for (X-Amz-Invocation-Type).
type InvocationType string

const (
	RequestResponse InvocationType = "RequestResponse"
	Event           InvocationType = "Event"
)

// Trigger is who asked for an invocation.
type Trigger string

const (
	// TriggerInvokeAPI: a call of the HTTP Invoke API (an SDK client,
	// possibly inside an emulated function).
	TriggerInvokeAPI Trigger = "invoke-api"
	// TriggerSchedule: a tick of a Schedule.
	TriggerSchedule Trigger = "schedule"
	// TriggerDirect: Emulator.Invoke or InvokeAsync from Go.
	TriggerDirect Trigger = "direct"
)

// Outcome is how an invocation ended.
type Outcome string

const (
	OutcomeSucceeded Outcome = "succeeded"
	// OutcomeFunctionError: the runtime posted an error.
	OutcomeFunctionError Outcome = "function_error"
	// OutcomeTimedOut: the timeout passed; the environment was killed.
	OutcomeTimedOut Outcome = "timed_out"
	// OutcomeCrashed: the process exited during the invocation by itself.
	OutcomeCrashed Outcome = "crashed"
	// OutcomeKilled: the fault injector killed the environment.
	OutcomeKilled Outcome = "killed"
	// OutcomeInitFailed: the cold start failed (an init error posted, the
	// process exited, or InitTimeout passed before its first poll).
	OutcomeInitFailed Outcome = "init_failed"
	// OutcomeEmulatorClosed: Close ended it.
	OutcomeEmulatorClosed Outcome = "emulator_closed"
)

// DropReason is why an asynchronous event was discarded unrun or unfinished.
type DropReason string

const (
	// DropMaxEventAge: it waited MaximumEventAge (throttled or between
	// retries) without succeeding.
	DropMaxEventAge DropReason = "max_event_age"
	// DropRetriesExhausted: it failed 1 + MaximumRetryAttempts times.
	DropRetriesExhausted DropReason = "retries_exhausted"
)

// Invocation is the record of one invocation, as Lambda's REPORT line
// and the caller would know it.
type Invocation struct {
	Function  string
	RequestID string
	Type      InvocationType
	Trigger   Trigger
	// Attempt counts from 1; an asynchronous event retried after a
	// failure is invoked again with the same request id.
	Attempt int
	// Queued is when an asynchronous event was accepted (zero for
	// RequestResponse); Start when an environment was given to it (the
	// cold start, if any, follows); InvokeStart when the event was handed
	// to the runtime; End when the answer came or the invocation was cut
	// short.
	Queued, Start, InvokeStart, End time.Time
	Environment                     int
	ColdStart                       bool
	InitDuration                    time.Duration
	Outcome                         Outcome
	// ErrorType is the errorType of a failed invocation's answer.
	ErrorType string
	Payload   []byte
	Response  []byte
	// MaxMemoryUsedMB is the process's peak resident memory (VmHWM) when
	// the invocation ended, as Lambda's REPORT line gives it.
	MaxMemoryUsedMB int
	// CPU is the CPU time (user and system) the environment's process
	// spent in a successful invoke phase, in the kernel's 10 ms ticks:
	// what a drain costs per message, with or without a CPU share.
	CPU time.Duration
}

// Duration is the invoke phase's duration, what Lambda bills after the
// cold start.
func (inv Invocation) Duration() time.Duration {
	if inv.InvokeStart.IsZero() {
		return 0
	}
	return inv.End.Sub(inv.InvokeStart)
}

// DroppedEvent is an asynchronous event discarded.
type DroppedEvent struct {
	RequestID string
	Trigger   Trigger
	Queued    time.Time
	Dropped   time.Time
	Attempts  int
	Reason    DropReason
}

// ConcurrencySample is the function's state after a change.
type ConcurrencySample struct {
	At time.Time
	// InFlight counts the environments given an invocation (cold starts
	// included): Lambda's concurrency.
	InFlight int
	// Environments counts every live environment, idle ones included.
	Environments int
}

// LogLine is one line a function printed.
type LogLine struct {
	At          time.Time
	Environment int
	// RequestID is the invocation the environment last started: the line's
	// invocation unless it was printed between two.
	RequestID string
	// Stream is "stdout" or "stderr".
	Stream string
	Text   string
}

// Stats sum what happened to one function.
type Stats struct {
	Function string
	// Outcomes counts the invocations by type and outcome; Invocations is
	// their total (throttled calls are not invocations).
	Outcomes    map[InvocationType]map[Outcome]int
	Invocations int
	ColdStarts  int
	// EnvironmentsStarted, …ShutDown (idle past IdleLifetime), …Killed
	// (timeouts, crashes, faults, failed cold starts).
	EnvironmentsStarted, EnvironmentsShutDown, EnvironmentsKilled int
	// MaxConcurrency is the most invocations in flight at once;
	// MaxEnvironments the most live environments.
	MaxConcurrency, MaxEnvironments int
	// MaxInitDuration is the slowest cold start: process start to the
	// first poll of the Runtime API (at the CPU share, when capped).
	MaxInitDuration time.Duration
	// SyncThrottles are RequestResponse calls answered 429;
	// AsyncThrottles are attempts to run a queued event refused for want
	// of capacity (each retried after a backoff).
	SyncThrottles, AsyncThrottles int
	// AsyncAccepted counts events queued; AsyncRetries the re-runs of
	// events after a failure; Dropped the events discarded, by reason.
	AsyncAccepted, AsyncRetries int
	Dropped                     map[DropReason]int
	MaxQueueDepth               int
	// FaultKills counts the environments the fault injector killed.
	FaultKills int
	// BilledDuration sums the invocations' init and invoke phases, each
	// rounded up to the millisecond; GBSeconds weighs it by MemoryMB.
	BilledDuration time.Duration
	GBSeconds      float64
	// CPU sums the cpu.stat counters of the ended environments when the
	// emulator caps CPU (Emulator.CPUStat adds the live ones).
	CPU CPUStat
}

// Count is the invocations of type t that ended with o.
func (s Stats) Count(t InvocationType, o Outcome) int { return s.Outcomes[t][o] }

// observations are one function's records. Their mutex is taken inside
// Emulator.mu, never the other way round.
type observations struct {
	mu          sync.Mutex
	memoryMB    int
	stats       Stats
	invocations []Invocation
	dropped     []DroppedEvent
	concurrency []ConcurrencySample
	logs        []LogLine
}

func newObservations(name string, memoryMB int) *observations {
	return &observations{memoryMB: memoryMB, stats: Stats{
		Function: name, Outcomes: map[InvocationType]map[Outcome]int{}, Dropped: map[DropReason]int{},
	}}
}

func (o *observations) invocation(inv Invocation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.invocations = append(o.invocations, inv)
	s := &o.stats
	if s.Outcomes[inv.Type] == nil {
		s.Outcomes[inv.Type] = map[Outcome]int{}
	}
	s.Outcomes[inv.Type][inv.Outcome]++
	s.Invocations++
	if inv.ColdStart {
		s.ColdStarts++
		s.MaxInitDuration = max(s.MaxInitDuration, inv.InitDuration)
	}
	if inv.Attempt > 1 {
		s.AsyncRetries++
	}
	billed := roundUpToMillisecond(inv.InitDuration) + roundUpToMillisecond(inv.Duration())
	s.BilledDuration += billed
	s.GBSeconds += billed.Seconds() * float64(o.memoryMB) / 1024
}

func roundUpToMillisecond(d time.Duration) time.Duration {
	return time.Duration(math.Ceil(float64(d)/float64(time.Millisecond))) * time.Millisecond
}

func (o *observations) sample(inFlight, environments int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.concurrency = append(o.concurrency, ConcurrencySample{At: time.Now(), InFlight: inFlight, Environments: environments})
	o.stats.MaxConcurrency = max(o.stats.MaxConcurrency, inFlight)
	o.stats.MaxEnvironments = max(o.stats.MaxEnvironments, environments)
}

func (o *observations) count(field func(*Stats)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	field(&o.stats)
}

func (o *observations) drop(d DroppedEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dropped = append(o.dropped, d)
	o.stats.Dropped[d.Reason]++
}

func (o *observations) log(l LogLine, keep bool) {
	if !keep {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.logs = append(o.logs, l)
}

func (o *observations) snapshot() Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.stats
	s.Outcomes = map[InvocationType]map[Outcome]int{}
	for t, byOutcome := range o.stats.Outcomes {
		s.Outcomes[t] = maps.Clone(byOutcome)
	}
	s.Dropped = maps.Clone(o.stats.Dropped)
	return s
}

// Stats are the function's counters so far.
func (e *Emulator) Stats(function string) (Stats, error) {
	o, err := e.observationsOf(function)
	if err != nil {
		return Stats{}, err
	}
	return o.snapshot(), nil
}

// Invocations are the function's finished invocations, in the order they
// ended.
func (e *Emulator) Invocations(function string) ([]Invocation, error) {
	o, err := e.observationsOf(function)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.invocations), nil
}

// DroppedEvents are the function's discarded asynchronous events.
func (e *Emulator) DroppedEvents(function string) ([]DroppedEvent, error) {
	o, err := e.observationsOf(function)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.dropped), nil
}

// Concurrency is the function's concurrency over time: one sample per
// change.
func (e *Emulator) Concurrency(function string) ([]ConcurrencySample, error) {
	o, err := e.observationsOf(function)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.concurrency), nil
}

// Logs are the lines the function's environments printed (none when
// Options.DiscardLogs is set).
func (e *Emulator) Logs(function string) ([]LogLine, error) {
	o, err := e.observationsOf(function)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.logs), nil
}

// observationsOf works after Close too: the records outlive the emulation.
func (e *Emulator) observationsOf(function string) (*observations, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f, ok := e.functions[function]
	if !ok {
		return nil, &NotFoundError{Function: function}
	}
	return f.obs, nil
}
