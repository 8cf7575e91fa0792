package sns

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/arn"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
)

// API is the part of the SNS client the publisher uses; *sns.Client
// satisfies it.
type API interface {
	PublishBatch(ctx context.Context, in *sns.PublishBatchInput, optFns ...func(*sns.Options)) (*sns.PublishBatchOutput, error)
}

var _ API = (*sns.Client)(nil)

// Defaults for the zero fields of a Config.
const (
	DefaultGroupID         = "outbox"
	DefaultMaxMessageBytes = 262144 // SNS's default cap: 256 KiB
	DefaultTimeout         = 10 * time.Second
	DefaultConcurrency     = 8

	// MaxMessageBytesLimit is the largest cap a topic can be configured with.
	MaxMessageBytesLimit = 1 << 20
)

// Config configures a Publisher for one topic.
type Config struct {
	// TopicARN is the topic (required). A name ending in ".fifo" is a FIFO
	// topic: every message then carries a MessageGroupId and a
	// MessageDeduplicationId.
	TopicARN string
	// DefaultGroupID is the MessageGroupId, on a FIFO topic, of the messages
	// without an ordering key (default "outbox"). At most 128 letters,
	// digits and ASCII punctuation.
	DefaultGroupID string
	// MaxMessageBytes is the topic's cap on one message and on one
	// PublishBatch request, as SNS counts them: the body plus every
	// attribute's name, data type and value (default 262144, at most
	// 1048576).
	MaxMessageBytes int
	// Timeout bounds each PublishBatch call, the SDK's own retries included
	// (default 10s).
	Timeout time.Duration
	// Concurrency is the number of PublishBatch calls in flight per Publish
	// (default 8). The client's HTTP connection pool must keep at least as
	// many idle connections per host; see NewClient.
	Concurrency int
	// CloudEvents, when set, makes each message's body the message as a
	// structured CloudEvent instead of its payload (route format
	// cloudevents); the attributes stay as they are.
	CloudEvents *cloudevent.Encoder
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c Config) WithDefaults() Config {
	if c.DefaultGroupID == "" {
		c.DefaultGroupID = DefaultGroupID
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	return c
}

// Validate reports the first field out of range, by name. It expects the
// defaults applied.
func (c Config) Validate() error {
	if c.TopicARN == "" {
		return errors.New("sns: TopicARN is required")
	}
	a, err := arn.Parse(c.TopicARN)
	if err != nil {
		return fmt.Errorf("sns: TopicARN %q is not an ARN: %w", c.TopicARN, err)
	}
	if a.Service != "sns" || a.Resource == "" || strings.Contains(a.Resource, ":") {
		return fmt.Errorf("sns: TopicARN %q is not an SNS topic ARN (arn:aws:sns:region:account:name)", c.TopicARN)
	}
	switch {
	case !validFIFOID(c.DefaultGroupID):
		return fmt.Errorf("sns: DefaultGroupID %q must be 1-128 letters, digits and ASCII punctuation", c.DefaultGroupID)
	case c.MaxMessageBytes < 1 || c.MaxMessageBytes > MaxMessageBytesLimit:
		return fmt.Errorf("sns: MaxMessageBytes must be between 1 and %d, got %d", MaxMessageBytesLimit, c.MaxMessageBytes)
	case c.Timeout <= 0:
		return fmt.Errorf("sns: Timeout must be positive, got %s", c.Timeout)
	case c.Concurrency < 1:
		return fmt.Errorf("sns: Concurrency must be at least 1, got %d", c.Concurrency)
	}
	return nil
}

// Publisher publishes outbox messages to one SNS topic with PublishBatch.
// It is safe for concurrent use.
type Publisher struct {
	client          API
	topicARN        *string
	fifo            bool
	defaultGroupID  string
	maxMessageBytes int
	timeout         time.Duration
	cloudEvents     *cloudevent.Encoder
	batcher         publish.Batcher[types.PublishBatchRequestEntry]
}

var _ publish.Publisher = (*Publisher)(nil)

// New returns a Publisher for cfg.TopicARN that calls client. It applies
// cfg's defaults and validates it; the error names the field at fault.
func New(client API, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("sns: client is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Publisher{
		client:          client,
		topicARN:        aws.String(cfg.TopicARN),
		fifo:            strings.HasSuffix(cfg.TopicARN, ".fifo"),
		defaultGroupID:  cfg.DefaultGroupID,
		maxMessageBytes: cfg.MaxMessageBytes,
		timeout:         cfg.Timeout,
		cloudEvents:     cfg.CloudEvents,
	}
	p.batcher = publish.Batcher[types.PublishBatchRequestEntry]{
		MaxEntries:  maxBatchEntries,
		MaxBytes:    cfg.MaxMessageBytes,
		Concurrency: cfg.Concurrency,
		Prepare:     p.prepare,
		Call:        p.publishBatch,
		Isolation:   publish.IsolateInHalves,
	}
	return p, nil
}

// FIFO reports whether the topic is a FIFO topic.
func (p *Publisher) FIFO() bool { return p.fifo }

// Publish sends msgs to the topic and returns one result per message, in
// order: delivered with the SNS MessageId as target ref, retryable,
// terminal, or released behind an earlier message of its ordering key. See
// the package documentation for the mapping of errors.
func (p *Publisher) Publish(ctx context.Context, msgs []*outboxtype.Message) []publish.Result {
	return p.batcher.Publish(ctx, msgs)
}

// prepare encodes one message, or refuses it before any call.
func (p *Publisher) prepare(m *outboxtype.Message) (types.PublishBatchRequestEntry, int, *publish.Result) {
	if m == nil {
		r := publish.Fail(outboxtype.CodeInvalidPayload, errors.New("sns: nil message"))
		return types.PublishBatchRequestEntry{}, 0, &r
	}
	entry, size, err := p.encode(m)
	if err != nil {
		r := publish.Fail(outboxtype.CodeInvalidPayload, err)
		if _, tooLarge := err.(*TooLargeError); tooLarge {
			r.Code = outboxtype.CodePayloadTooLarge
		}
		return entry, 0, &r
	}
	return entry, size, nil
}

// publishBatch makes one PublishBatch call of entries and answers each. It
// asks the Batcher to isolate when SNS refused the call as a whole for one
// entry it does not name (see the package doc).
func (p *Publisher) publishBatch(ctx context.Context, _ []*outboxtype.Message, entries []types.PublishBatchRequestEntry, results []publish.Result) (isolate bool) {
	for j := range entries {
		// An entry's id is its index in the call, which maps an answer
		// back to its entry without a lookup.
		entries[j].Id = entryIDs[j]
	}
	callCtx, cancel := context.WithTimeout(ctx, p.timeout)
	out, err := p.client.PublishBatch(callCtx, &sns.PublishBatchInput{TopicArn: p.topicARN, PublishBatchRequestEntries: entries})
	cancel()
	if err != nil {
		r, isolate := callResult(ctx, err)
		if r.Code == outboxtype.CodeTimeout {
			r.Err = fmt.Errorf("sns: no answer within the %s timeout: %w", p.timeout, r.Err)
		}
		for j := range results {
			results[j] = r
		}
		return isolate
	}

	// results arrive zeroed: an entry SNS answers twice keeps its first
	// answer, and one it does not answer is caught below.
	position := func(id *string) (int, bool) {
		if id == nil || len(*id) != 1 || (*id)[0] < '0' || (*id)[0] > '9' {
			return 0, false
		}
		j := int((*id)[0] - '0')
		return j, j < len(results) && results[j].Kind == 0
	}
	if out != nil {
		for _, s := range out.Successful {
			if j, ok := position(s.Id); ok {
				results[j] = publish.Ok(aws.ToString(s.MessageId))
			}
		}
		for _, f := range out.Failed {
			if j, ok := position(f.Id); ok {
				results[j] = entryResult(f)
			}
		}
	}
	for j := range results {
		if results[j].Kind == 0 {
			results[j] = publish.Retry(outboxtype.CodeTarget5xx, errNoAnswer, 0)
		}
	}
	return false
}
