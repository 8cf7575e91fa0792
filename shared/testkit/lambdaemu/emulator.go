package lambdaemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// Region, Account and Partition make up the ARNs the emulator answers to
// and hands its functions.
const (
	Region    = "us-east-1"
	Account   = "123456789012"
	Partition = "aws"
)

// DefaultAccountConcurrency is Lambda's default quota of concurrent
// executions per account and region.
const DefaultAccountConcurrency = 1000

// Options are the emulator's account-wide settings.
type Options struct {
	// AccountConcurrency bounds the executions in flight at once across
	// the functions without reserved concurrency, less what the others
	// reserve (default DefaultAccountConcurrency).
	AccountConcurrency int
	// Logf, when set, is told about every environment started and ended
	// and every fault injected.
	Logf func(format string, args ...any)
	// OnLog, when set, sees every line a function prints as it arrives
	// (EMF documents, JSON logs). It runs on the copy of the process's
	// output, so it must be quick: while it blocks, so does the function's
	// next write.
	OnLog func(function string, line LogLine)
	// DiscardLogs keeps no lines for Logs: for long runs that count what
	// they need through OnLog.
	DiscardLogs bool
	// CPU caps each execution environment's CPU (default unlimited);
	// see CPUShare and Emulator.CPUShareStatus.
	CPU CPUShare
}

// Emulator is a local Lambda service: functions, their execution
// environments, the Invoke API over HTTP, asynchronous event queues,
// schedules and fault injection. Close ends everything it started.
type Emulator struct {
	opts     Options
	cpu      CPUShareStatus
	server   *http.Server
	endpoint string

	// ctx ends at Close: it bounds every invocation and background loop.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards the functions, their environments and queues, and the
	// account's concurrency; a single lock keeps the capacity rules
	// (reserved and unreserved pools) in one place.
	mu             sync.Mutex
	functions      map[string]*function
	reserved       int
	unreservedBusy int
	closed         bool
}

// New starts an emulator with its Invoke API on a free loopback port.
func New(opts Options) (*Emulator, error) {
	if opts.AccountConcurrency == 0 {
		opts.AccountConcurrency = DefaultAccountConcurrency
	}
	if opts.AccountConcurrency < 1 {
		return nil, fmt.Errorf("lambdaemu: AccountConcurrency must be positive, got %d", opts.AccountConcurrency)
	}
	cpu, err := setUpCPUShare(opts.CPU)
	if err != nil {
		return nil, err
	}
	if opts.CPU.Mode != CPUUnlimited && opts.Logf != nil {
		opts.Logf("lambdaemu: %s", cpu)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cpu.removeDir()
		return nil, fmt.Errorf("lambdaemu: listen for the Invoke API: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Emulator{
		opts: opts, cpu: cpu, endpoint: "http://" + l.Addr().String(),
		ctx: ctx, cancel: cancel, functions: map[string]*function{},
	}
	e.server = &http.Server{Handler: http.HandlerFunc(e.serveInvokeAPI), ReadHeaderTimeout: 10 * time.Second}
	go e.server.Serve(l)
	return e, nil
}

// URL is the Invoke API's endpoint: what AWS_ENDPOINT_URL_LAMBDA names.
func (e *Emulator) URL() string { return e.endpoint }

// AWSConfig is an SDK configuration that sends Lambda calls to the
// emulator, with static credentials and no SDK retries, so that a caller
// sees every throttle.
func (e *Emulator) AWSConfig() aws.Config {
	return aws.Config{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDLAMBDAEMU", "lambdaemu-secret", ""),
		BaseEndpoint: aws.String(e.endpoint),
		Retryer:      func() aws.Retryer { return aws.NopRetryer{} },
	}
}

// ErrClosed is returned by calls made after Close.
var ErrClosed = errors.New("lambdaemu: emulator closed")

// Close stops the schedules and queues, ends every execution environment
// (SIGKILL: the emulation is over, nothing to drain) and the Invoke API.
// Invocations still running end with OutcomeEmulatorClosed.
func (e *Emulator) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	e.mu.Unlock()
	e.cancel()
	e.wg.Wait()
	e.mu.Lock()
	var envs []*environment
	for _, f := range e.functions {
		envs = append(envs, f.envs...)
		f.envs, f.idle = nil, nil
	}
	e.mu.Unlock()
	for _, env := range envs {
		env.stopNow()
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.server.Shutdown(shutdownCtx)
	if err := e.cpu.removeDir(); err != nil {
		e.logf("lambdaemu: remove the CPU group %s: %v", e.cpu.Dir, err)
	}
}

func (e *Emulator) logf(format string, args ...any) {
	if e.opts.Logf != nil {
		e.opts.Logf(format, args...)
	}
}

// goBackground runs fn on a goroutine Close waits for.
func (e *Emulator) goBackground(fn func()) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		fn()
	}()
	return true
}
