package lambdainvoke

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
)

// Limits and defaults of the Config fields.
const (
	DefaultTimeout         = 30 * time.Second
	DefaultMaxPayloadBytes = 1 << 20
	// MaxPayloadBytes is Lambda's cap on a synchronous invocation's request.
	MaxPayloadBytes    = 6291456
	DefaultConcurrency = 8
)

// API is the part of the Lambda client the publisher uses; *lambda.Client
// implements it.
type API interface {
	Invoke(ctx context.Context, in *lambda.InvokeInput, optFns ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

// Config is one Lambda plugin target.
type Config struct {
	// Function is the function's name or ARN, optionally with
	// ":qualifier" (a version or alias); required.
	Function string
	// Timeout bounds each invocation (default DefaultTimeout). Set it
	// above the function's own timeout, or a slow invocation is retried
	// while it still runs.
	Timeout time.Duration
	// MaxPayloadBytes caps the request, the envelope (default
	// DefaultMaxPayloadBytes, at most MaxPayloadBytes).
	MaxPayloadBytes int
	// Concurrency is the number of invocations in flight per Publish call
	// (default DefaultConcurrency).
	Concurrency int
	// CloudEvents, when set, makes the invocation's payload the message as
	// a structured CloudEvent instead of the envelope (route format
	// cloudevents).
	CloudEvents *cloudevent.Encoder
}

func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	return c
}

func (c Config) validate() error {
	switch {
	case c.Function == "":
		return errors.New("lambdainvoke: function is required")
	case c.Timeout < 0:
		return fmt.Errorf("lambdainvoke: timeout must be positive, got %s", c.Timeout)
	case c.MaxPayloadBytes < 0 || c.MaxPayloadBytes > MaxPayloadBytes:
		return fmt.Errorf("lambdainvoke: max_payload_bytes must be between 1 and %d (Lambda's synchronous cap), got %d", MaxPayloadBytes, c.MaxPayloadBytes)
	case c.Concurrency < 0:
		return fmt.Errorf("lambdainvoke: concurrency must be positive, got %d", c.Concurrency)
	}
	return nil
}

// Publisher invokes one function per message. It is safe for concurrent
// use; build one per target, once per cold start.
type Publisher struct {
	client     API
	function   string
	timeout    time.Duration
	maxPayload int
	batcher    publish.Batcher[[]byte]
}

var _ publish.Publisher = (*Publisher)(nil)

// New builds a Publisher for cfg on client.
func New(client API, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("lambdainvoke: nil client")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &Publisher{
		client:     client,
		function:   cfg.Function,
		timeout:    cfg.Timeout,
		maxPayload: cfg.MaxPayloadBytes,
	}
	prepare := publish.PrepareEnvelope("lambdainvoke", p.maxPayload)
	if cfg.CloudEvents != nil {
		prepare = publish.PrepareBody("lambdainvoke", "CloudEvent", p.maxPayload, cfg.CloudEvents.Structured)
	}
	p.batcher = publish.Batcher[[]byte]{MaxEntries: 1, Concurrency: cfg.Concurrency, Prepare: prepare, Call: p.invoke}
	return p, nil
}

// NewHTTPClient is an SDK HTTP client (aws.Config.HTTPClient) that keeps
// enough idle connections for concurrency invocations in flight.
func NewHTTPClient(concurrency int) *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConnsPerHost = max(concurrency, t.MaxIdleConnsPerHost)
		t.MaxIdleConns = max(concurrency, t.MaxIdleConns)
	})
}

// Publish invokes the function once per message, up to Concurrency at
// once, each ordering key's one after another in sequence order (see
// publish.Publisher), and returns one result per message, in order.
func (p *Publisher) Publish(ctx context.Context, msgs []*outboxtype.Message) []publish.Result {
	return p.batcher.Publish(ctx, msgs)
}

// invoke is the Batcher's call: one invocation, one message.
func (p *Publisher) invoke(ctx context.Context, _ []*outboxtype.Message, bodies [][]byte, results []publish.Result) bool {
	callCtx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	out, err := p.client.Invoke(callCtx, &lambda.InvokeInput{
		FunctionName:   &p.function,
		InvocationType: types.InvocationTypeRequestResponse,
		Payload:        bodies[0],
	})
	results[0] = p.classify(ctx, out, err)
	return false
}
