package lambdainvoke

import (
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

const testFunction = "arn:aws:lambda:us-east-1:123456789012:function:audit-sink"

// newTestPublisher starts a fake, registers testFunction with h and
// returns a publisher on the real SDK client pointed at the fake.
func newTestPublisher(t testing.TB, h lambdafake.Handler, configure func(*Config)) (*Publisher, *lambdafake.Server) {
	t.Helper()
	fake := lambdafake.New(t)
	if h != nil {
		fake.Handle(testFunction, h)
	}
	cfg := Config{Function: testFunction, Concurrency: 4}
	if configure != nil {
		configure(&cfg)
	}
	p, err := New(lambda.NewFromConfig(fake.Config()), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p, fake
}

func ok(body string) lambdafake.Handler {
	return func([]byte) (int, []byte, string) { return 200, []byte(body), "" }
}

func publishOne(t *testing.T, p *Publisher) publish.Result {
	t.Helper()
	results := p.Publish(t.Context(), []*outboxtype.Message{publishtest.Message(0, 64)})
	if len(results) != 1 {
		t.Fatalf("%d results for one message", len(results))
	}
	return results[0]
}

func TestConformance(t *testing.T) {
	t.Parallel()
	publishtest.Run(t, func(t *testing.T) *publishtest.Target {
		var mu sync.Mutex
		var received []uuid.UUID
		var calls [][]uuid.UUID
		fail := map[uuid.UUID]bool{}
		const maxPayload = 8 << 10
		p, fake := newTestPublisher(t, func(envelope []byte) (int, []byte, string) {
			id, err := publishtest.EnvelopeMessageID(envelope)
			if err != nil {
				return 200, []byte(`{"status":"rejected","error":"not an envelope with a msg_id"}`), ""
			}
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, []uuid.UUID{id})
			if terminal, ok := fail[id]; ok {
				if terminal {
					return 200, []byte(`{"status":"rejected","error":"the suite refuses this message"}`), ""
				}
				return 200, []byte(`{"errorType":"Error","errorMessage":"the suite fails this message for now"}`), "Unhandled"
			}
			received = append(received, id)
			return 200, []byte(`{"status":"ok"}`), ""
		}, func(c *Config) { c.MaxPayloadBytes = maxPayload })
		return &publishtest.Target{
			Publisher:       p,
			MaxPayloadBytes: maxPayload,
			Received: func() []uuid.UUID {
				mu.Lock()
				defer mu.Unlock()
				return append([]uuid.UUID(nil), received...)
			},
			Calls: func() [][]uuid.UUID {
				mu.Lock()
				defer mu.Unlock()
				return append([][]uuid.UUID(nil), calls...)
			},
			Requests: fake.Requests,
			Fail: func(id uuid.UUID, terminal bool) {
				mu.Lock()
				defer mu.Unlock()
				fail[id] = terminal
			},
			Stall: fake.Stall,
		}
	})
}

func TestInvocationRequest(t *testing.T) {
	t.Parallel()
	p, fake := newTestPublisher(t, ok(""), nil)
	m := publishtest.Message(0, 64)
	m.OrderingKey, m.SequenceID = "order-42", 7
	if r := p.Publish(t.Context(), []*outboxtype.Message{m})[0]; r.Kind != publish.Delivered {
		t.Fatalf("%s %s %v", r.Kind, r.Code, r.Err)
	}
	calls := fake.Invocations()
	if len(calls) != 1 {
		t.Fatalf("%d invocations", len(calls))
	}
	call := calls[0]
	if call.Function != testFunction || call.InvocationType != "RequestResponse" {
		t.Errorf("invoked %q as %q, want %q as RequestResponse", call.Function, call.InvocationType, testFunction)
	}
	want, _ := publish.EncodeEnvelope(m)
	if string(call.Payload) != string(want) {
		t.Errorf("payload\n%s\nwant the envelope\n%s", call.Payload, want)
	}
}

func TestQualifiedFunctionName(t *testing.T) {
	t.Parallel()
	fake := lambdafake.New(t)
	fake.Handle("audit-sink:live", ok(""))
	p, err := New(lambda.NewFromConfig(fake.Config()), Config{Function: "audit-sink:live"})
	if err != nil {
		t.Fatal(err)
	}
	if r := publishOne(t, p); r.Kind != publish.Delivered {
		t.Fatalf("%s %s %v", r.Kind, r.Code, r.Err)
	}
}

func TestResponseContract(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name          string
		body          string
		functionError string
		kind          publish.Kind
		code          outboxtype.Code
		retryAfter    time.Duration
		errHas        string
	}{
		{name: "empty response", body: "", kind: publish.Delivered},
		{name: "null", body: "null", kind: publish.Delivered},
		{name: "a string", body: `"done"`, kind: publish.Delivered},
		{name: "an object without status", body: `{"processed":3}`, kind: publish.Delivered},
		{name: "status ok", body: `{"status":"ok"}`, kind: publish.Delivered},
		{name: "status delivered", body: ` {"status":"delivered"}`, kind: publish.Delivered},
		{name: "status null", body: `{"status":null}`, kind: publish.Delivered},
		{name: "rejected", body: `{"status":"rejected","error":"unknown customer"}`,
			kind: publish.Terminal, code: outboxtype.CodeTargetRejected, errHas: "rejected: unknown customer"},
		{name: "retry", body: `{"status":"retry","error":"ledger locked","retry_after_seconds":30}`,
			kind: publish.Retryable, code: outboxtype.CodeTarget5xx, retryAfter: 30 * time.Second, errHas: "ledger locked"},
		{name: "retry, seconds as a string", body: `{"status":"retry","retry_after_seconds":"1.5"}`,
			kind: publish.Retryable, code: outboxtype.CodeTarget5xx, retryAfter: 1500 * time.Millisecond},
		{name: "retry, absurd seconds", body: `{"status":"retry","retry_after_seconds":1e300}`,
			kind: publish.Retryable, code: outboxtype.CodeTarget5xx, retryAfter: 24 * time.Hour},
		{name: "unknown status", body: `{"status":"maybe"}`,
			kind: publish.Retryable, code: outboxtype.CodeTarget5xx, errHas: `status "maybe" is not one the plugin contract allows`},
		{name: "status not a string", body: `{"status":1}`,
			kind: publish.Retryable, code: outboxtype.CodeTarget5xx, errHas: "not a string"},
		{name: "function error", functionError: "Unhandled",
			body: `{"errorType":"ConnectionError","errorMessage":"db down","stackTrace":[]}`,
			kind: publish.Retryable, code: outboxtype.CodeFunctionError, errHas: "function error (Unhandled) ConnectionError: db down"},
		{name: "function timeout", functionError: "Unhandled",
			body: `{"errorType":"Sandbox.Timedout","errorMessage":"Task timed out after 3.00 seconds"}`,
			kind: publish.Retryable, code: outboxtype.CodeFunctionError, errHas: "Task timed out"},
		{name: "terminal function error", functionError: "Unhandled",
			body: `{"errorType":"TerminalError","errorMessage":"invoice already void"}`,
			kind: publish.Terminal, code: outboxtype.CodeFunctionError, errHas: "invoice already void"},
		{name: "terminal function error, Java", functionError: "Unhandled",
			body: `{"errorType":"com.example.billing.TerminalError","errorMessage":"no such account"}`,
			kind: publish.Terminal, code: outboxtype.CodeFunctionError, errHas: "no such account"},
		{name: "terminal function error, nested class", functionError: "Handled",
			body: `{"errorType":"com.example.Plugin$TerminalError","errorMessage":"nope"}`,
			kind: publish.Terminal, code: outboxtype.CodeFunctionError},
		{name: "not quite TerminalError", functionError: "Unhandled",
			body: `{"errorType":"NotTerminalError","errorMessage":"x"}`,
			kind: publish.Retryable, code: outboxtype.CodeFunctionError},
		{name: "function error, odd payload", functionError: "Unhandled", body: `out of memory`,
			kind: publish.Retryable, code: outboxtype.CodeFunctionError, errHas: "out of memory"},
		{name: "function error says rejected in its body: still a function error", functionError: "Unhandled",
			body: `{"status":"ok"}`, kind: publish.Retryable, code: outboxtype.CodeFunctionError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, fake := newTestPublisher(t, func([]byte) (int, []byte, string) {
				return 200, []byte(tc.body), tc.functionError
			}, nil)
			r := publishOne(t, p)
			if r.Kind != tc.kind || r.Code != tc.code || r.RetryAfter != tc.retryAfter {
				t.Fatalf("got %s %q retry-after %s (%v), want %s %q retry-after %s", r.Kind, r.Code, r.RetryAfter, r.Err, tc.kind, tc.code, tc.retryAfter)
			}
			if tc.kind == publish.Delivered {
				if _, err := uuid.Parse(r.TargetRef); err != nil {
					t.Errorf("target ref %q is not the request id", r.TargetRef)
				}
				return
			}
			if r.Err == nil || !strings.Contains(r.Err.Error(), tc.errHas) || !strings.Contains(r.Err.Error(), testFunction) {
				t.Errorf("error %v, want one naming the function and containing %q", r.Err, tc.errHas)
			}
			if n := fake.Requests(); n != 1 {
				t.Errorf("%d requests, want 1", n)
			}
		})
	}
}

// TestTerminalErrorTypeName holds TerminalError to what aws-lambda-go
// reports as a returned error's errorType: the pointed-to type's name.
func TestTerminalErrorTypeName(t *testing.T) {
	t.Parallel()
	var err error = &TerminalError{Message: "x"}
	if name := reflect.TypeOf(err).Elem().Name(); !isTerminalErrorType(name) {
		t.Errorf("aws-lambda-go would report errorType %q, which is not terminal", name)
	}
}

func TestAPIErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status     int
		errorType  string
		retryAfter string
		kind       publish.Kind
		code       outboxtype.Code
		wait       time.Duration
	}{
		{429, "TooManyRequestsException", "3", publish.Retryable, outboxtype.CodeThrottled, 3 * time.Second},
		{502, "EC2ThrottledException", "", publish.Retryable, outboxtype.CodeThrottled, 0},
		{500, "ServiceException", "", publish.Retryable, outboxtype.CodeTarget5xx, 0},
		{502, "ResourceNotReadyException", "", publish.Retryable, outboxtype.CodeTarget5xx, 0},
		{409, "ResourceConflictException", "", publish.Retryable, outboxtype.CodeTarget5xx, 0},
		{502, "EFSMountTimeoutException", "", publish.Retryable, outboxtype.CodeTarget5xx, 0},
		{404, "ResourceNotFoundException", "", publish.Terminal, outboxtype.CodeTargetNotFound, 0},
		{403, "AccessDeniedException", "", publish.Terminal, outboxtype.CodeAccessDenied, 0},
		{502, "KMSAccessDeniedException", "", publish.Terminal, outboxtype.CodeAccessDenied, 0},
		{502, "KMSDisabledException", "", publish.Terminal, outboxtype.CodeAccessDenied, 0},
		{413, "RequestTooLargeException", "", publish.Terminal, outboxtype.CodePayloadTooLarge, 0},
		{400, "InvalidRequestContentException", "", publish.Terminal, outboxtype.CodeInvalidPayload, 0},
		{415, "UnsupportedMediaTypeException", "", publish.Terminal, outboxtype.CodeInvalidPayload, 0},
		{400, "InvalidParameterValueException", "", publish.Terminal, outboxtype.CodeTargetRejected, 0},
		{400, "RecursiveInvocationException", "", publish.Terminal, outboxtype.CodeTargetRejected, 0},
		{403, "UnrecognizedClientException", "", publish.Terminal, outboxtype.CodeAccessDenied, 0},
		{503, "SomethingNewException", "10", publish.Retryable, outboxtype.CodeTarget5xx, 10 * time.Second},
		{429, "SomethingNewThrottle", "", publish.Retryable, outboxtype.CodeThrottled, 0},
		{418, "SomethingNewException", "", publish.Terminal, outboxtype.CodeTargetRejected, 0},
	}
	for _, tc := range cases {
		t.Run(tc.errorType, func(t *testing.T) {
			t.Parallel()
			p, fake := newTestPublisher(t, ok(""), nil)
			fake.FailCallsWith(1, lambdafake.APIError{Status: tc.status, Type: tc.errorType, RetryAfter: tc.retryAfter})
			r := publishOne(t, p)
			if r.Kind != tc.kind || r.Code != tc.code || r.RetryAfter != tc.wait {
				t.Fatalf("%d %s: got %s %s retry-after %s (%v), want %s %s retry-after %s",
					tc.status, tc.errorType, r.Kind, r.Code, r.RetryAfter, r.Err, tc.kind, tc.code, tc.wait)
			}
			if !strings.Contains(r.Err.Error(), tc.errorType) || !strings.Contains(r.Err.Error(), testFunction) {
				t.Errorf("error %q does not name the error type and the function", r.Err)
			}
			if n := len(fake.Invocations()); n != 0 {
				t.Errorf("the function ran %d times", n)
			}
		})
	}
}

func TestUnknownFunctionIsTargetNotFound(t *testing.T) {
	t.Parallel()
	p, _ := newTestPublisher(t, nil, nil) // nothing registered
	if r := publishOne(t, p); r.Kind != publish.Terminal || r.Code != outboxtype.CodeTargetNotFound {
		t.Errorf("got %s %s %v, want terminal TARGET_NOT_FOUND", r.Kind, r.Code, r.Err)
	}
}

func TestTimeoutIsRetryableWithinTheConfiguredTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 150 * time.Millisecond
	p, fake := newTestPublisher(t, ok(""), func(c *Config) { c.Timeout = timeout })
	fake.SetLatency(time.Minute)
	start := time.Now()
	results := p.Publish(t.Context(), publishtest.Messages(3, 64))
	took := time.Since(start)
	for i, r := range results {
		if r.Kind != publish.Retryable || r.Code != outboxtype.CodeTimeout || !strings.Contains(r.Err.Error(), "no answer within 150ms") {
			t.Errorf("message %d: %s %s %v, want retryable TIMEOUT saying how long it waited", i, r.Kind, r.Code, r.Err)
		}
	}
	// The fake answers after a minute: well before it, however busy the
	// machine, is the timeout at work.
	if took < timeout || took >= time.Minute/2 {
		t.Errorf("Publish took %s with a %s timeout", took, timeout)
	}
}

func TestNoAnswerIsRetryableNetwork(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	fake := lambdafake.New(t)
	cfg := fake.Config()
	cfg.BaseEndpoint = aws.String("http://" + addr)
	p, err := New(lambda.NewFromConfig(cfg), Config{Function: testFunction})
	if err != nil {
		t.Fatal(err)
	}
	if r := publishOne(t, p); r.Kind != publish.Retryable || r.Code != outboxtype.CodeNetwork {
		t.Errorf("got %s %s %v, want retryable NETWORK", r.Kind, r.Code, r.Err)
	}
}

func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	inFlight, peak := 0, 0
	p, _ := newTestPublisher(t, func([]byte) (int, []byte, string) {
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		mu.Unlock()
		time.Sleep(15 * time.Millisecond)
		mu.Lock()
		inFlight--
		mu.Unlock()
		return 200, nil, ""
	}, func(c *Config) { c.Concurrency = 3 })
	for i, r := range p.Publish(t.Context(), publishtest.Messages(24, 64)) {
		if r.Kind != publish.Delivered {
			t.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if peak != 3 {
		t.Errorf("peak of %d invocations in flight, want exactly Concurrency = 3", peak)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	fake := lambdafake.New(t)
	client := lambda.NewFromConfig(fake.Config())
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "function is required"},
		{Config{Function: "f", MaxPayloadBytes: MaxPayloadBytes + 1}, fmt.Sprint(MaxPayloadBytes)},
		{Config{Function: "f", Timeout: -1}, "timeout"},
		{Config{Function: "f", Concurrency: -1}, "concurrency"},
	} {
		if _, err := New(client, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := New(nil, Config{Function: "f"}); err == nil {
		t.Error("a nil client was accepted")
	}
	p, err := New(client, Config{Function: "f"})
	if err != nil {
		t.Fatal(err)
	}
	if p.timeout != DefaultTimeout || p.maxPayload != DefaultMaxPayloadBytes || p.batcher.Concurrency != DefaultConcurrency {
		t.Errorf("defaults not applied: %+v", p)
	}
	if c := NewHTTPClient(32).GetTransport(); c.MaxIdleConnsPerHost < 32 {
		t.Errorf("NewHTTPClient(32) keeps %d idle connections per host", c.MaxIdleConnsPerHost)
	}
}

func TestAPanicCostsOneMessageNotTheProcess(t *testing.T) {
	t.Parallel()
	p, _ := newTestPublisher(t, ok(""), nil)
	msgs := publishtest.Messages(6, 64)
	msgs[2] = nil // a bug upstream
	for i, r := range p.Publish(t.Context(), msgs) {
		if i == 2 {
			if r.Kind != publish.Retryable || !strings.Contains(fmt.Sprint(r.Err), "panic") {
				t.Errorf("nil message: %s %s %v, want retryable naming the panic", r.Kind, r.Code, r.Err)
			}
		} else if r.Kind != publish.Delivered {
			t.Errorf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
		}
	}
}
