// Package lambdatest runs the real compiled bootstrap binaries of the
// functions under a test server that implements the AWS Lambda Runtime API
// (https://docs.aws.amazon.com/lambda/latest/dg/runtimes-api.html): the
// binary polls /2018-06-01/runtime/invocation/next, receives an event with
// the Lambda-Runtime-Aws-Request-Id and Lambda-Runtime-Deadline-Ms headers,
// and posts to /response or /error; an initialisation failure posts to
// /runtime/init/error. Tests invoke functions exactly as Lambda would.
//
// The same address serves the part of the Extensions API
// (https://docs.aws.amazon.com/lambda/latest/dg/runtimes-extensions-api.html)
// that a runtime's internal extension uses: /2020-01-01/extension/register
// and an /extension/event/next that never answers. aws-lambda-go registers
// such an extension for lambda.WithEnableSIGTERM, because Lambda sends
// SIGTERM at shutdown only to an environment with an extension.
package lambdatest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// Build compiles ./functions/<name> of the module containing the working
// directory into a bootstrap binary, once per test binary, with the flags
// the deployment uses (CGO off, lambda.norpc, trimpath, stripped), for the
// host's architecture. It returns the binary's path.
func Build(t testing.TB, name string) string {
	t.Helper()
	path, err := BuildBinary(name)
	if err != nil {
		t.Fatalf("lambdatest: %v", err)
	}
	return path
}

// BuildBinary is Build for programs that are not tests (a soak, a
// benchmark driver): it returns an error instead of failing a test.
func BuildBinary(name string) (string, error) {
	return BuildPackage("./functions/" + name)
}

// BuildPackage is BuildBinary for any main package of the module, named
// by its directory relative to the module's root (e.g. a test function
// under shared/testkit).
func BuildPackage(dir string) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if path, ok := built[dir]; ok {
		return path, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp("", "lambdatest-"+filepath.Base(dir)+"-")
	if err != nil {
		return "", err
	}
	out := filepath.Join(tmp, "bootstrap")
	cmd := exec.Command("go", "build", "-tags", "lambda.norpc", "-trimpath", "-ldflags", "-s -w", "-o", out, dir)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", dir, err, msg)
	}
	built[dir] = out
	return out, nil
}

// modulePath is the product module's path: builds run from its root even
// when called from another module that requires it (bench/).
const modulePath = "github.com/outboxkit/dispatcher"

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module "+modulePath+"\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s above the working directory", modulePath)
		}
		dir = parent
	}
}

// Response is a function's answer to one invocation.
type Response struct {
	// Body is the JSON answer, or the error document {"errorMessage","errorType"}.
	Body []byte
	// Err is set when the function reported an error.
	Err *FunctionError
}

// FunctionError is what the runtime posted to /error or /init/error.
type FunctionError struct {
	Type    string `json:"errorType"`
	Message string `json:"errorMessage"`
	// Init is true for an initialisation (cold start) failure.
	Init bool `json:"-"`
}

func (e *FunctionError) Error() string { return e.Type + ": " + e.Message }

type invocation struct {
	id       string
	payload  []byte
	deadline time.Time
	done     chan Response
}

// Function is one running bootstrap process and the Runtime API serving it.
type Function struct {
	name     string
	cmd      *exec.Cmd
	server   *http.Server
	addr     string
	queue    chan *invocation
	mu       sync.Mutex
	inflight map[string]*invocation
	initErr  chan *FunctionError
	exited   chan error
	stdout   *syncBuffer
	stderr   *syncBuffer
	started  time.Time
	// extensions are the names the process registered with the
	// Extensions API, in order.
	extensions []string
	// firstPoll is closed at the binary's first /next request.
	firstPoll chan struct{}
	pollOnce  sync.Once
	coldStart time.Duration
	seq       int
	traceID   string
	// freeze: stop the process while it waits for an invocation (frozen
	// is whether it is stopped now), as Lambda freezes an idle sandbox.
	freeze bool
	frozen bool
}

// DefaultTraceHeader is the Lambda-Runtime-Trace-Id sent with invocations:
// not sampled, as for a function without active tracing.
const DefaultTraceHeader = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0"

// SetTraceHeader sets the Lambda-Runtime-Trace-Id of later invocations
// (e.g. Sampled=1, as with active tracing).
func (f *Function) SetTraceHeader(h string) {
	f.mu.Lock()
	f.traceID = h
	f.mu.Unlock()
}

// Start runs the binary with env (KEY=VALUE) on top of a minimal Lambda
// environment, and stops it when the test ends.
func Start(t testing.TB, binary, name string, env ...string) *Function {
	t.Helper()
	f, err := Launch(binary, name, env...)
	if err != nil {
		t.Fatalf("lambdatest: %v", err)
	}
	t.Cleanup(f.Stop)
	return f
}

// Launch is Start for programs that are not tests: the caller stops the
// function.
func Launch(binary, name string, env ...string) (*Function, error) {
	return LaunchWith(binary, name, Options{Env: env})
}

// Options are LaunchWith's settings.
type Options struct {
	// Env (KEY=VALUE) is added to the minimal Lambda environment; a key
	// given twice takes its last value.
	Env []string
	// Stdout and Stderr, when set, receive the process's output instead of
	// the buffers Stdout() and Stderr() read, which then stay empty: a
	// long run need not keep everything it printed.
	Stdout, Stderr io.Writer
	// Freeze stops the process (SIGSTOP) while it waits for its next
	// invocation and continues it (SIGCONT) when one arrives, as Lambda
	// freezes an idle execution environment: its background goroutines
	// (timers, pool health checks) do not run between invocations.
	Freeze bool
}

// LaunchWith is Launch with Options.
func LaunchWith(binary, name string, opts Options) (*Function, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &Function{
		name: name, addr: l.Addr().String(), queue: make(chan *invocation),
		inflight: map[string]*invocation{}, initErr: make(chan *FunctionError, 1),
		exited: make(chan error, 1), stdout: &syncBuffer{}, stderr: &syncBuffer{},
		firstPoll: make(chan struct{}), freeze: opts.Freeze,
	}
	env := opts.Env
	mux := http.NewServeMux()
	mux.HandleFunc("GET /2018-06-01/runtime/invocation/next", f.next)
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/response", f.respond)
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/error", f.fail)
	mux.HandleFunc("POST /2018-06-01/runtime/init/error", f.failInit)
	mux.HandleFunc("POST /2020-01-01/extension/register", f.registerExtension)
	mux.HandleFunc("GET /2020-01-01/extension/event/next", f.nextExtensionEvent)
	f.server = &http.Server{Handler: mux}

	f.cmd = exec.Command(binary)
	f.cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"AWS_LAMBDA_RUNTIME_API=" + f.addr,
		"AWS_LAMBDA_FUNCTION_NAME=" + name,
		"AWS_LAMBDA_FUNCTION_VERSION=$LATEST",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=256",
		"AWS_LAMBDA_LOG_GROUP_NAME=/aws/lambda/" + name,
		"AWS_LAMBDA_LOG_STREAM_NAME=test-stream",
		"AWS_REGION=us-east-1",
		"AWS_DEFAULT_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=testing",
		"AWS_SECRET_ACCESS_KEY=testing",
		"_HANDLER=bootstrap",
	}, env...)
	f.cmd.Stdout, f.cmd.Stderr = io.Writer(f.stdout), io.Writer(f.stderr)
	if opts.Stdout != nil {
		f.cmd.Stdout = opts.Stdout
	}
	if opts.Stderr != nil {
		f.cmd.Stderr = opts.Stderr
	}
	f.mu.Lock()
	f.started = time.Now()
	f.mu.Unlock()
	if err := f.cmd.Start(); err != nil {
		l.Close()
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	// Served only now: the handlers signal the process (Freeze), and the
	// bootstrap's first poll waits in the listener's backlog meanwhile.
	go f.server.Serve(l)
	go func() { f.exited <- f.cmd.Wait() }()
	return f, nil
}

// Shutdown ends the process as Lambda ends an execution environment it no
// longer needs: SIGTERM, then SIGKILL if it has not exited within grace.
// The server is closed too.
func (f *Function) Shutdown(grace time.Duration) {
	if exited, _ := f.Exited(); !exited {
		f.cmd.Process.Signal(syscall.SIGTERM)
		f.thaw() // a stopped process would not see the signal
		select {
		case err := <-f.exited:
			f.exited <- err
		case <-time.After(grace):
		}
	}
	f.Stop()
}

// Stop kills the process and the server.
func (f *Function) Stop() {
	// The exit status travels through f.exited (the waiting goroutine owns
	// cmd.ProcessState); put it back for any later reader.
	select {
	case err := <-f.exited:
		f.exited <- err
	default:
		f.cmd.Process.Kill()
		select {
		case err := <-f.exited:
			f.exited <- err
		case <-time.After(5 * time.Second):
		}
	}
	f.server.Close()
}

// Kill sends SIGKILL, as a crashed or timed-out sandbox would see, and waits
// for the process to die.
func (f *Function) Kill() {
	f.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case err := <-f.exited:
		f.exited <- err
	case <-time.After(5 * time.Second):
	}
}

// Extensions are the names of the extensions the process registered: with
// one, Lambda would send it SIGTERM before ending its environment.
func (f *Function) Extensions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.extensions...)
}

// PID is the function process's id, e.g. to read its memory from /proc.
func (f *Function) PID() int { return f.cmd.Process.Pid }

// Stdout is everything the function printed (its JSON logs and EMF documents).
func (f *Function) Stdout() string { return f.stdout.String() }

// Stderr is everything the function printed on stderr.
func (f *Function) Stderr() string { return f.stderr.String() }

// ColdStart waits for the binary's first poll of /next and returns how long
// it took from process start: the cold start of the runtime, before any
// invocation.
func (f *Function) ColdStart(timeout time.Duration) (time.Duration, error) {
	select {
	case <-f.firstPoll:
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.coldStart, nil
	case e := <-f.initErr:
		f.initErr <- e
		return 0, e
	case err := <-f.exited:
		f.exited <- err
		// An initialisation failure is posted before the process exits:
		// prefer it, whichever of the two select saw first.
		select {
		case e := <-f.initErr:
			f.initErr <- e
			return 0, e
		default:
		}
		return 0, fmt.Errorf("%s exited before polling: %v\n%s", f.name, err, f.Stderr())
	case <-time.After(timeout):
		return 0, fmt.Errorf("%s did not poll within %s", f.name, timeout)
	}
}

// Invoke sends one event with the given time budget and waits for the answer.
func (f *Function) Invoke(ctx context.Context, payload []byte, budget time.Duration) (Response, error) {
	f.mu.Lock()
	f.seq++
	id := fmt.Sprintf("req-%s-%04d-%d", f.name, f.seq, time.Now().UnixNano()%1_000_000)
	f.mu.Unlock()
	return f.InvokeRequest(ctx, Request{ID: id, Payload: payload, Deadline: time.Now().Add(budget)})
}

// Request is one invocation as the Runtime API hands it to the runtime.
type Request struct {
	// ID is the Lambda-Runtime-Aws-Request-Id; it must be unique.
	ID      string
	Payload []byte
	// Deadline is sent as Lambda-Runtime-Deadline-Ms.
	Deadline time.Time
}

// InvokeRequest is Invoke with the request id and the deadline chosen by
// the caller (an emulation of the Lambda service answers with the request
// id its runtime saw). It returns when the function answers, the process
// exits or ctx ends, whichever is first; the deadline itself is only
// passed on: the caller decides what happens when it passes.
func (f *Function) InvokeRequest(ctx context.Context, req Request) (Response, error) {
	inv := &invocation{
		id:       req.ID,
		payload:  req.Payload,
		deadline: req.Deadline,
		done:     make(chan Response, 1),
	}
	select {
	case f.queue <- inv:
	case e := <-f.initErr:
		f.initErr <- e
		return Response{Err: e}, nil
	case err := <-f.exited:
		f.exited <- err
		select {
		case e := <-f.initErr:
			f.initErr <- e
			return Response{Err: e}, nil
		default:
		}
		return Response{}, fmt.Errorf("%s exited: %v\nstderr: %s\nstdout: %s", f.name, err, f.Stderr(), f.Stdout())
	case <-ctx.Done():
		return Response{}, ctx.Err()
	}
	select {
	case r := <-inv.done:
		return r, nil
	case err := <-f.exited:
		f.exited <- err
		return Response{}, fmt.Errorf("%s exited during the invocation: %v", f.name, err)
	case <-ctx.Done():
		return Response{}, ctx.Err()
	}
}

// InvokeJSON invokes and decodes a successful answer into out; a function
// error is returned as *FunctionError.
func (f *Function) InvokeJSON(ctx context.Context, event any, budget time.Duration, out any) error {
	var payload []byte
	switch e := event.(type) {
	case []byte:
		payload = e
	case string:
		payload = []byte(e)
	default:
		var err error
		if payload, err = json.Marshal(event); err != nil {
			return err
		}
	}
	r, err := f.Invoke(ctx, payload, budget)
	if err != nil {
		return err
	}
	if r.Err != nil {
		return r.Err
	}
	if out != nil {
		if err := json.Unmarshal(r.Body, out); err != nil {
			return fmt.Errorf("decode %s's answer %q: %w", f.name, r.Body, err)
		}
	}
	return nil
}

// Exited reports whether the process has exited, with its error.
func (f *Function) Exited() (bool, error) {
	select {
	case err := <-f.exited:
		f.exited <- err
		return true, err
	default:
		return false, nil
	}
}

func (f *Function) next(w http.ResponseWriter, r *http.Request) {
	f.pollOnce.Do(func() {
		f.mu.Lock()
		f.coldStart = time.Since(f.started)
		f.mu.Unlock()
		close(f.firstPoll)
	})
	var inv *invocation
	select {
	case inv = <-f.queue:
	default:
		if f.freeze {
			f.stop()
		}
		select {
		case inv = <-f.queue:
		case <-r.Context().Done():
			return
		}
	}
	f.thaw()
	{
		f.mu.Lock()
		f.inflight[inv.id] = inv
		f.mu.Unlock()
		h := w.Header()
		h.Set("Lambda-Runtime-Aws-Request-Id", inv.id)
		h.Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(inv.deadline.UnixMilli(), 10))
		h.Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:"+f.name)
		f.mu.Lock()
		trace := f.traceID
		f.mu.Unlock()
		if trace == "" {
			trace = DefaultTraceHeader
		}
		h.Set("Lambda-Runtime-Trace-Id", trace)
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write(inv.payload)
	}
}

// stop freezes the process: it has asked for its next invocation and has
// none yet.
func (f *Function) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.frozen && f.cmd.Process.Signal(syscall.SIGSTOP) == nil {
		f.frozen = true
	}
}

// thaw continues a frozen process.
func (f *Function) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		f.cmd.Process.Signal(syscall.SIGCONT)
		f.frozen = false
	}
}

func (f *Function) take(id string) *invocation {
	f.mu.Lock()
	defer f.mu.Unlock()
	inv := f.inflight[id]
	delete(f.inflight, id)
	return inv
}

func (f *Function) respond(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	inv := f.take(r.PathValue("id"))
	if inv == nil {
		http.Error(w, `{"errorMessage":"unknown request id"}`, http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusAccepted)
	inv.done <- Response{Body: body}
}

func (f *Function) fail(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	inv := f.take(r.PathValue("id"))
	if inv == nil {
		http.Error(w, `{"errorMessage":"unknown request id"}`, http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusAccepted)
	inv.done <- Response{Body: body, Err: decodeError(body, r.Header.Get("Lambda-Runtime-Function-Error-Type"), false)}
}

func (f *Function) failInit(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.WriteHeader(http.StatusAccepted)
	select {
	case f.initErr <- decodeError(body, r.Header.Get("Lambda-Runtime-Function-Error-Type"), true):
	default:
	}
}

// registerExtension accepts an extension's registration, as Lambda does
// during the Init phase.
func (f *Function) registerExtension(w http.ResponseWriter, r *http.Request) {
	name := r.Header.Get("Lambda-Extension-Name")
	if name == "" {
		http.Error(w, `{"errorMessage":"missing Lambda-Extension-Name","errorType":"InvalidRequest"}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.extensions = append(f.extensions, name)
	id := fmt.Sprintf("ext-%d-%s", len(f.extensions), name)
	f.mu.Unlock()
	w.Header().Set("Lambda-Extension-Identifier", id)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{"functionName": f.name, "functionVersion": "$LATEST", "handler": "bootstrap"})
}

// nextExtensionEvent holds the request until the server closes: the
// internal extensions that run here register for no event, so none comes.
func (f *Function) nextExtensionEvent(w http.ResponseWriter, r *http.Request) {
	<-r.Context().Done()
}

func decodeError(body []byte, headerType string, init bool) *FunctionError {
	e := &FunctionError{Init: init}
	if err := json.Unmarshal(body, e); err != nil {
		e.Message = strings.TrimSpace(string(body))
	}
	if e.Type == "" {
		e.Type = headerType
	}
	return e
}

// syncBuffer is a bytes.Buffer safe for the process's writer and the test's reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
