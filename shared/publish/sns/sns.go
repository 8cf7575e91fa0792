package sns

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/arn"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/publish"
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
	concurrency     int
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
	return &Publisher{
		client:          client,
		topicARN:        aws.String(cfg.TopicARN),
		fifo:            strings.HasSuffix(cfg.TopicARN, ".fifo"),
		defaultGroupID:  cfg.DefaultGroupID,
		maxMessageBytes: cfg.MaxMessageBytes,
		timeout:         cfg.Timeout,
		concurrency:     cfg.Concurrency,
	}, nil
}

// FIFO reports whether the topic is a FIFO topic.
func (p *Publisher) FIFO() bool { return p.fifo }

// Publish sends msgs to the topic and returns one result per message, in
// order: delivered with the SNS MessageId as target ref, retryable, or
// terminal. See the package documentation for the mapping of errors.
func (p *Publisher) Publish(ctx context.Context, msgs []*lease.Message) []publish.Result {
	results := make([]publish.Result, len(msgs))
	workers := min(p.concurrency, len(msgs))
	if workers <= 1 {
		p.plan(msgs, results, func(c chunk) { p.publishChunk(ctx, c, 0, len(c.entries), results) })
		return results
	}
	// A fixed set of workers takes the chunks in order as they are planned,
	// so the first call goes out while the rest is still being encoded: at
	// most Concurrency calls in flight, and no goroutine per chunk.
	chunks := make(chan chunk, len(msgs)/maxBatchEntries+1)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c := range chunks {
				p.publishChunk(ctx, c, 0, len(c.entries), results)
			}
		})
	}
	p.plan(msgs, results, func(c chunk) { chunks <- c })
	close(chunks)
	wg.Wait()
	return results
}

// chunk is one PublishBatch request's worth of messages.
type chunk struct {
	// entries carry ids "0" to "9": their index in the chunk.
	entries []types.PublishBatchRequestEntry
	// origin[j] is the index in msgs (and results) of entries[j].
	origin []int
}

// plan encodes every message, answers those that cannot be sent in results,
// and hands the rest to emit in chunks of at most 10 entries whose total
// size is within the cap. Chunks keep the input order, so a chunk's entries
// reach SNS in the order they were claimed. Every chunk is a window on two
// arrays allocated once per call.
func (p *Publisher) plan(msgs []*lease.Message, results []publish.Result, emit func(chunk)) {
	entries := make([]types.PublishBatchRequestEntry, 0, len(msgs))
	origin := make([]int, 0, len(msgs))
	start, chunkBytes := 0, 0
	for i, m := range msgs {
		if m == nil {
			results[i] = publish.Fail(publish.CodeInvalidPayload, errors.New("sns: nil message"))
			continue
		}
		entry, size, err := p.encode(m)
		if err != nil {
			if _, tooLarge := err.(*TooLargeError); tooLarge {
				results[i] = publish.Fail(publish.CodePayloadTooLarge, err)
			} else {
				results[i] = publish.Fail(publish.CodeInvalidPayload, err)
			}
			continue
		}
		j := len(entries)
		if j > start && (j-start == maxBatchEntries || chunkBytes+size > p.maxMessageBytes) {
			emit(chunk{entries: entries[start:j:j], origin: origin[start:j:j]})
			start, chunkBytes = j, 0
		}
		entry.Id = entryIDs[j-start]
		chunkBytes += size
		entries = append(entries, entry)
		origin = append(origin, i)
	}
	if j := len(entries); j > start {
		emit(chunk{entries: entries[start:j:j], origin: origin[start:j:j]})
	}
}

// publishChunk sends c.entries[lo:hi] — the whole chunk or, when isolating
// a bad entry, a part of it — and answers its messages.
func (p *Publisher) publishChunk(ctx context.Context, c chunk, lo, hi int, results []publish.Result) {
	if err := ctx.Err(); err != nil {
		// The invocation is over: what has not been sent is not sent.
		r, _ := publish.ContextResult(ctx, err)
		c.fill(lo, hi, results, r)
		return
	}
	callCtx, cancel := context.WithTimeout(ctx, p.timeout)
	out, err := p.client.PublishBatch(callCtx, &sns.PublishBatchInput{TopicArn: p.topicARN, PublishBatchRequestEntries: c.entries[lo:hi]})
	cancel()
	if err != nil {
		r, isolate := callResult(ctx, err)
		if isolate && hi-lo > 1 {
			mid := lo + (hi-lo)/2
			p.publishChunk(ctx, c, lo, mid, results)
			p.publishChunk(ctx, c, mid, hi, results)
			return
		}
		if r.Code == publish.CodeTimeout {
			r.Err = fmt.Errorf("sns: no answer within the %s timeout: %w", p.timeout, r.Err)
		}
		c.fill(lo, hi, results, r)
		return
	}

	var answered [maxBatchEntries]bool
	position := func(id *string) (int, bool) {
		// An id is one digit, the entry's index in its chunk; a part of a
		// chunk keeps the ids it was given.
		if id == nil || len(*id) != 1 || (*id)[0] < '0' || (*id)[0] > '9' {
			return 0, false
		}
		j := int((*id)[0] - '0')
		return j, j >= lo && j < hi && !answered[j-lo]
	}
	if out != nil {
		for _, s := range out.Successful {
			if j, ok := position(s.Id); ok {
				answered[j-lo] = true
				results[c.origin[j]] = publish.Ok(aws.ToString(s.MessageId))
			}
		}
		for _, f := range out.Failed {
			if j, ok := position(f.Id); ok {
				answered[j-lo] = true
				results[c.origin[j]] = entryResult(f)
			}
		}
	}
	for j := lo; j < hi; j++ {
		if !answered[j-lo] {
			results[c.origin[j]] = publish.Retry(publish.CodeTarget5xx, errNoAnswer, 0)
		}
	}
}

func (c chunk) fill(lo, hi int, results []publish.Result, r publish.Result) {
	for j := lo; j < hi; j++ {
		results[c.origin[j]] = r
	}
}
