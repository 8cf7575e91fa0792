package lambdaemu

import (
	"fmt"
	"regexp"
	"time"
)

// Lambda's defaults and limits that the emulator applies.
const (
	DefaultTimeout       = 3 * time.Second
	MaxTimeout           = 15 * time.Minute
	DefaultMemoryMB      = 128
	DefaultInitTimeout   = 10 * time.Second
	DefaultIdleLifetime  = 5 * time.Minute
	DefaultShutdownGrace = 500 * time.Millisecond
)

// FunctionConfig is one function as its deployment would configure it.
type FunctionConfig struct {
	// Name is the function's name (1-64 letters, digits, - and _).
	Name string
	// Binary is the bootstrap to run (lambdatest.BuildBinary).
	Binary string
	// Env (KEY=VALUE) is the function's environment. The emulator adds
	// what Lambda sets (AWS_LAMBDA_FUNCTION_NAME, …_MEMORY_SIZE, the
	// Runtime API address, region and credentials) and
	// AWS_ENDPOINT_URL_LAMBDA pointing at itself, so that the function's
	// own SDK client invokes emulated functions; Env may override them.
	Env []string
	// Timeout ends an invocation: at it the environment is killed
	// (default DefaultTimeout, at most MaxTimeout).
	Timeout time.Duration
	// MemoryMB is passed as AWS_LAMBDA_FUNCTION_MEMORY_SIZE and used for
	// GB-seconds; it is not enforced (default DefaultMemoryMB).
	MemoryMB int
	// ReservedConcurrency, when positive, is the most environments that
	// run invocations at once, taken out of the account's pool; zero
	// shares the account's unreserved pool.
	ReservedConcurrency int
	// InitTimeout bounds a cold start: the bootstrap's start up to its
	// first poll for an invocation (default DefaultInitTimeout).
	InitTimeout time.Duration
	// IdleLifetime is how long an idle environment is kept warm before
	// it is shut down (default DefaultIdleLifetime; Lambda does not
	// document its own, minutes in practice).
	IdleLifetime time.Duration
	// ShutdownGrace is the time between SIGTERM and SIGKILL when an idle
	// environment is shut down (default DefaultShutdownGrace).
	ShutdownGrace time.Duration
	// NoFreeze lets idle environments run between invocations; by default
	// they are stopped (SIGSTOP) as Lambda freezes them.
	NoFreeze bool
	// Async is the asynchronous invocation configuration.
	Async AsyncConfig
}

var functionNamePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (c FunctionConfig) withDefaults() FunctionConfig {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MemoryMB == 0 {
		c.MemoryMB = DefaultMemoryMB
	}
	if c.InitTimeout == 0 {
		c.InitTimeout = DefaultInitTimeout
	}
	if c.IdleLifetime == 0 {
		c.IdleLifetime = DefaultIdleLifetime
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	c.Async = c.Async.withDefaults()
	return c
}

func (c FunctionConfig) validate() error {
	switch {
	case !functionNamePattern.MatchString(c.Name):
		return fmt.Errorf("lambdaemu: function name %q must be 1-64 letters, digits, - and _", c.Name)
	case c.Binary == "":
		return fmt.Errorf("lambdaemu: function %s: Binary is required", c.Name)
	case c.Timeout < time.Millisecond || c.Timeout > MaxTimeout:
		return fmt.Errorf("lambdaemu: function %s: Timeout must be between 1ms and %s, got %s", c.Name, MaxTimeout, c.Timeout)
	case c.MemoryMB < 128 || c.MemoryMB > 10240:
		return fmt.Errorf("lambdaemu: function %s: MemoryMB must be between 128 and 10240, got %d", c.Name, c.MemoryMB)
	case c.ReservedConcurrency < 0:
		return fmt.Errorf("lambdaemu: function %s: ReservedConcurrency must not be negative, got %d", c.Name, c.ReservedConcurrency)
	case c.InitTimeout < 0 || c.IdleLifetime < 0 || c.ShutdownGrace < 0:
		return fmt.Errorf("lambdaemu: function %s: InitTimeout, IdleLifetime and ShutdownGrace must not be negative", c.Name)
	}
	return c.Async.validate(c.Name)
}

// ARN is the function's ARN in the emulated account.
func ARN(name string) string {
	return fmt.Sprintf("arn:%s:lambda:%s:%s:function:%s", Partition, Region, Account, name)
}

// function is a registered function and its runtime state; every field
// after cfg is guarded by Emulator.mu.
type function struct {
	cfg FunctionConfig

	envs      []*environment
	idle      []*environment // warm and free, the most recently used last
	busy      int
	nextEnvID int
	queue     asyncQueue
	kills     []*killPlan
	obs       *observations
}

// Register adds a function; its environments start on demand.
func (e *Emulator) Register(cfg FunctionConfig) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	if _, ok := e.functions[cfg.Name]; ok {
		return fmt.Errorf("lambdaemu: function %s is already registered", cfg.Name)
	}
	if e.reserved+cfg.ReservedConcurrency >= e.opts.AccountConcurrency && cfg.ReservedConcurrency > 0 {
		// Lambda keeps at least some unreserved concurrency for the
		// other functions; one is enough here.
		return fmt.Errorf("lambdaemu: function %s: reserving %d would leave the account (%d, %d reserved) no unreserved concurrency",
			cfg.Name, cfg.ReservedConcurrency, e.opts.AccountConcurrency, e.reserved)
	}
	e.reserved += cfg.ReservedConcurrency
	f := &function{cfg: cfg, obs: newObservations(cfg.Name, cfg.MemoryMB)}
	f.queue.wake = make(chan struct{}, 1)
	e.functions[cfg.Name] = f
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.runAsyncQueue(f)
	}()
	return nil
}

// lookup finds a registered function by name.
func (e *Emulator) lookup(name string) (*function, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	f, ok := e.functions[name]
	if !ok {
		return nil, &NotFoundError{Function: name}
	}
	return f, nil
}

// NotFoundError is an invocation of a function that is not registered.
type NotFoundError struct{ Function string }

func (e *NotFoundError) Error() string {
	return "lambdaemu: function not found: " + e.Function
}
