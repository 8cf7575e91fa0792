package eventbridge

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
)

// API is the part of the EventBridge client the publisher uses;
// *eventbridge.Client satisfies it.
type API interface {
	PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, optFns ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
}

var _ API = (*eventbridge.Client)(nil)

// Defaults and limits.
const (
	// DefaultSource is the Source template when Config.Source is empty.
	DefaultSource = "outbox.{namespace}"
	// DefaultDetailType is the DetailType template when Config.DetailType
	// is empty.
	DefaultDetailType = "{topic}"
	// DefaultMaxEntryBytes is the size cap when Config.MaxEntryBytes is 0:
	// 256 KiB, the cap of accounts not yet raised to 1 MiB.
	DefaultMaxEntryBytes = 256 * 1024
	// MaxEntryBytesLimit is the largest cap EventBridge offers (1 MiB).
	MaxEntryBytesLimit = 1024 * 1024
	// DefaultTimeout bounds one PutEvents call when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
	// DefaultConcurrency is the PutEvents calls in flight per Publish when
	// Config.Concurrency is 0.
	DefaultConcurrency = 8
	// MaxEntriesPerCall is EventBridge's limit on entries per PutEvents.
	MaxEntriesPerCall = 10
)

// EventBridge's own limits on an entry's fields.
const (
	maxSourceChars      = 256
	maxDetailTypeChars  = 128
	maxTraceHeaderChars = 500
	maxEventBusChars    = 1600
)

// eventBusPattern is the documented pattern of PutEventsRequestEntry's
// EventBusName: a bus name, or an event-bus ARN. Checking it once in New turns
// a mistyped bus into a cold-start error instead of a ValidationException on
// every call.
var eventBusPattern = regexp.MustCompile(`^(arn:aws[\w-]*:events:[a-z]+-[a-z]+-[\w-]+:[0-9]{12}:event-bus/)?[.\-_A-Za-z0-9]+$`)

// Config configures a Publisher for one route's event bus.
type Config struct {
	// EventBus is the bus's name or ARN; required.
	EventBus string
	// Source is the entry's Source template: literal text with {namespace}
	// and {topic} substituted per message. Default DefaultSource.
	Source string
	// DetailType is the entry's DetailType template, like Source. Default
	// DefaultDetailType.
	DetailType string
	// MaxEntryBytes caps each entry and each PutEvents request, by AWS's
	// entry-size formula (see EntrySize). Default DefaultMaxEntryBytes; at
	// most MaxEntryBytesLimit. It is a route setting because the account's
	// cap is either 256 KiB or 1 MiB.
	MaxEntryBytes int
	// Timeout bounds each PutEvents call, SDK retries included. Default
	// DefaultTimeout.
	Timeout time.Duration
	// Concurrency is the most PutEvents calls in flight per Publish.
	// Default DefaultConcurrency.
	Concurrency int
	// CloudEvents, when set, makes each entry's Detail the message as a
	// structured CloudEvent instead of its payload (route format
	// cloudevents); Source and DetailType stay as configured.
	CloudEvents *cloudevent.Encoder
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Source == "" {
		c.Source = DefaultSource
	}
	if c.DetailType == "" {
		c.DetailType = DefaultDetailType
	}
	if c.MaxEntryBytes == 0 {
		c.MaxEntryBytes = DefaultMaxEntryBytes
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.EventBus == "":
		return errors.New("eventbridge: Config.EventBus is required")
	case len(c.EventBus) > maxEventBusChars || !eventBusPattern.MatchString(c.EventBus):
		return fmt.Errorf("eventbridge: Config.EventBus %q is neither an event bus name ([.-_A-Za-z0-9]+) nor an event-bus ARN", c.EventBus)
	case c.MaxEntryBytes < 1 || c.MaxEntryBytes > MaxEntryBytesLimit:
		return fmt.Errorf("eventbridge: Config.MaxEntryBytes %d is outside 1..%d", c.MaxEntryBytes, MaxEntryBytesLimit)
	case c.Timeout < 0:
		return fmt.Errorf("eventbridge: Config.Timeout %s must be positive", c.Timeout)
	case c.Concurrency < 1:
		return fmt.Errorf("eventbridge: Config.Concurrency %d must be positive", c.Concurrency)
	}
	return nil
}

// Publisher publishes to one event bus. It is safe for concurrent use and
// meant to be built once per cold start.
type Publisher struct {
	client        API
	bus           *string // shared by every entry: the SDK only reads it
	source        template
	detailType    template
	maxEntryBytes int
	timeout       time.Duration
	concurrency   int
	cloudEvents   *cloudevent.Encoder
}

var _ publish.Publisher = (*Publisher)(nil)

// New validates cfg (after WithDefaults) and compiles its templates. Errors
// name the Config field at fault.
func New(client API, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("eventbridge: client is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	source, err := compileTemplate("Source", cfg.Source, maxSourceChars)
	if err != nil {
		return nil, err
	}
	detailType, err := compileTemplate("DetailType", cfg.DetailType, maxDetailTypeChars)
	if err != nil {
		return nil, err
	}
	return &Publisher{
		client: client, bus: aws.String(cfg.EventBus), source: source, detailType: detailType,
		maxEntryBytes: cfg.MaxEntryBytes, timeout: cfg.Timeout, concurrency: cfg.Concurrency, cloudEvents: cfg.CloudEvents,
	}, nil
}

// Publish sends msgs to the bus and returns one result per message, in
// order. Entries refused before a call (too large, not an object, a bad
// Source or DetailType) are terminal; the rest go out in calls of at most 10
// entries, at most Concurrency calls at a time, each ordering key's in
// sequence order (see publish.Publisher). When ctx ends, messages whose call
// has not been answered come back retryable (TIMEOUT or CANCELED), or
// released behind their key's first.
func (p *Publisher) Publish(ctx context.Context, msgs []*outboxtype.Message) []publish.Result {
	// The builder's slabs are sized for this Publish's messages.
	builder := p.newEntryBuilder(len(msgs))
	return publish.Batcher[types.PutEventsRequestEntry]{
		MaxEntries:  MaxEntriesPerCall,
		MaxBytes:    p.maxEntryBytes,
		Concurrency: p.concurrency,
		Prepare: func(m *outboxtype.Message) (types.PutEventsRequestEntry, int, *publish.Result) {
			entry, size, err := builder.entry(m)
			if err != nil {
				r := refusal(err)
				return entry, 0, &r
			}
			return entry, size, nil
		},
		Call: p.putEvents,
		// Each alone rather than in halves: an invalid request is often
		// the route's cap above the account's, which several entries
		// together break and each alone does not.
		Isolation: publish.IsolateOneByOne,
	}.Publish(ctx, msgs)
}

// putEvents makes one PutEvents call of entries and answers each. A call
// refused as a whole as invalid is so every time; it asks the Batcher to
// find the entry at fault.
func (p *Publisher) putEvents(ctx context.Context, _ []*outboxtype.Message, entries []types.PutEventsRequestEntry, results []publish.Result) (isolate bool) {
	callCtx, cancel := context.WithTimeout(ctx, p.timeout)
	resp, err := p.client.PutEvents(callCtx, &eventbridge.PutEventsInput{Entries: entries})
	cancel()
	if err != nil {
		r := classifyCall(ctx, fmt.Errorf("eventbridge: PutEvents of %d entries to bus %q: %w", len(entries), *p.bus, err))
		fill(results, r)
		return r.Kind == publish.Terminal && (r.Code == outboxtype.CodeInvalidPayload || r.Code == outboxtype.CodePayloadTooLarge)
	}
	for j := range results {
		if j >= len(resp.Entries) {
			results[j] = publish.Retry(outboxtype.CodeTarget5xx, fmt.Errorf(
				"%w: EventBridge answered %d result entries for %d sent; entry %d may or may not have been accepted",
				ErrMissingResult, len(resp.Entries), len(entries), j), 0)
			continue
		}
		results[j] = entryResult(resp.Entries[j])
	}
	return false
}

// entryResult reads one result entry of a PutEvents answer.
func entryResult(e types.PutEventsResultEntry) publish.Result {
	code, id := aws.ToString(e.ErrorCode), aws.ToString(e.EventId)
	switch {
	case code != "":
		// An error code decides even beside an EventId: EventBridge
		// documents the two as exclusive, and a refusal must not be
		// recorded as a delivery.
		return classifyEntry(code, aws.ToString(e.ErrorMessage))
	case id != "":
		return publish.Ok(id)
	}
	return publish.Retry(outboxtype.CodeTarget5xx, fmt.Errorf("%w: a result entry with neither an EventId nor an ErrorCode", ErrMissingResult), 0)
}

func fill(out []publish.Result, r publish.Result) {
	for i := range out {
		out[i] = r
	}
}
