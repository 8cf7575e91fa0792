package eventbridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/eventbridge"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// conformanceOverhead is what a publishtest message's entry adds to its
// payload under the default templates: Source "outbox.conformance" (18),
// DetailType "suite" (5) and Time (14).
const conformanceOverhead = 18 + 5 + 14

type testBundle struct {
	fake      *eventbridgefake.Server
	publisher *eventbridge.Publisher
}

// setup wires a publisher configured by cfg (EventBus defaulted to "orders")
// to a fresh fake, through a real SDK client.
func setup(t *testing.T, cfg eventbridge.Config) testBundle {
	t.Helper()
	fake := eventbridgefake.New(t)
	if cfg.EventBus == "" {
		cfg.EventBus = "orders"
	}
	p, err := eventbridge.New(awseb.NewFromConfig(fake.Config()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return testBundle{fake: fake, publisher: p}
}

func TestConformance(t *testing.T) {
	publishtest.Run(t, func(t *testing.T) *publishtest.Target {
		b := setup(t, eventbridge.Config{})
		return &publishtest.Target{
			Publisher:       b.publisher,
			MaxPayloadBytes: eventbridge.DefaultMaxEntryBytes - conformanceOverhead,
			Received:        b.fake.ReceivedIDs,
			Calls:           b.fake.CallIDs,
			Requests:        b.fake.Requests,
			Fail: func(id uuid.UUID, terminal bool) {
				if terminal {
					b.fake.FailMessage(id, "MalformedDetail", "Detail is malformed.")
				} else {
					b.fake.FailMessage(id, "InternalFailure", "internal failure")
				}
			},
			Stall: b.fake.Stall,
		}
	})
}

// byMessage indexes the fake's accepted entries by message id.
func byMessage(t *testing.T, fake *eventbridgefake.Server) map[uuid.UUID]eventbridgefake.Entry {
	t.Helper()
	out := map[uuid.UUID]eventbridgefake.Entry{}
	for _, e := range fake.Received() {
		if _, dup := out[e.MessageID()]; dup {
			t.Errorf("message %s accepted twice", e.MessageID())
		}
		out[e.MessageID()] = e
	}
	return out
}

func entryCode(err error) string {
	var entryErr *eventbridge.EntryError
	if errors.As(err, &entryErr) {
		return entryErr.ErrorCode
	}
	return ""
}

func TestPartialFailureMapsExactlyTheFailedEntries(t *testing.T) {
	t.Parallel()
	b := setup(t, eventbridge.Config{})
	msgs := publishtest.Messages(10, 200)
	b.fake.FailMessage(msgs[3].ID, "InternalFailure", "try again")
	b.fake.FailMessage(msgs[7].ID, "MalformedDetail", "Detail is malformed.")

	results := b.publisher.Publish(context.Background(), msgs)

	if n := b.fake.Requests(); n != 1 {
		t.Errorf("%d calls for 10 messages, want 1", n)
	}
	accepted := byMessage(t, b.fake)
	for i, r := range results {
		switch i {
		case 3:
			if r.Kind != publish.Retryable || r.Code != outboxtype.CodeTarget5xx || entryCode(r.Err) != "InternalFailure" {
				t.Errorf("message 3: %s %s %v, want retryable TARGET_5XX from InternalFailure", r.Kind, r.Code, r.Err)
			}
		case 7:
			if r.Kind != publish.Terminal || r.Code != outboxtype.CodeInvalidPayload || entryCode(r.Err) != "MalformedDetail" {
				t.Errorf("message 7: %s %s %v, want terminal INVALID_PAYLOAD from MalformedDetail", r.Kind, r.Code, r.Err)
			}
			if !strings.Contains(r.Err.Error(), "Detail is malformed.") {
				t.Errorf("message 7: error %q does not carry EventBridge's message", r.Err)
			}
		default:
			e, ok := accepted[msgs[i].ID]
			if r.Kind != publish.Delivered || !ok || r.TargetRef != e.EventID {
				t.Errorf("message %d: %s %s %v ref %q, want delivered with EventId %q", i, r.Kind, r.Code, r.Err, r.TargetRef, e.EventID)
			}
		}
	}
	if len(accepted) != 8 {
		t.Errorf("%d messages accepted, want 8", len(accepted))
	}
}

func TestWholeCallErrorsApplyToEveryEntry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status    int
		errorType string
		kind      publish.Kind
		code      outboxtype.Code
	}{
		{400, "ThrottlingException", publish.Retryable, outboxtype.CodeThrottled},
		{400, "LimitExceededException", publish.Retryable, outboxtype.CodeThrottled},
		{429, "", publish.Retryable, outboxtype.CodeThrottled},
		{500, "InternalException", publish.Retryable, outboxtype.CodeTarget5xx},
		{500, "com.amazonaws.eventbridge#InternalException", publish.Retryable, outboxtype.CodeTarget5xx},
		{503, "", publish.Retryable, outboxtype.CodeTarget5xx},
		{503, "ServiceUnavailable", publish.Retryable, outboxtype.CodeTarget5xx},
		{400, "AccessDeniedException", publish.Terminal, outboxtype.CodeAccessDenied},
		{400, "UnrecognizedClientException", publish.Terminal, outboxtype.CodeAccessDenied},
		{403, "InvalidSignatureException", publish.Terminal, outboxtype.CodeAccessDenied},
		{403, "ExpiredTokenException", publish.Retryable, outboxtype.CodeAccessDenied},
		{400, "ResourceNotFoundException", publish.Terminal, outboxtype.CodeTargetNotFound},
		{400, "BrandNewException", publish.Retryable, outboxtype.CodeTargetRejected},
		{404, "", publish.Retryable, outboxtype.CodeTargetNotFound},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d %s", c.status, c.errorType), func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventbridge.Config{})
			b.fake.FailCalls(2, c.status, c.errorType) // both calls of 12 messages
			msgs := publishtest.Messages(12, 64)
			results := b.publisher.Publish(context.Background(), msgs)
			if len(results) != len(msgs) {
				t.Fatalf("%d results for %d messages", len(results), len(msgs))
			}
			for i, r := range results {
				if r.Kind != c.kind || r.Code != c.code || r.Err == nil {
					t.Errorf("message %d: %s %s %v, want %s %s", i, r.Kind, r.Code, r.Err, c.kind, c.code)
				}
			}
			if n := b.fake.Requests(); n != 2 {
				t.Errorf("%d calls, want 2", n)
			}
			if n := len(b.fake.Received()); n != 0 {
				t.Errorf("%d accepted", n)
			}
		})
	}
}

func TestValidationExceptionIsolatesTheEntryAtFault(t *testing.T) {
	t.Parallel()
	t.Run("injected", func(t *testing.T) {
		t.Parallel()
		b := setup(t, eventbridge.Config{})
		b.fake.FailCalls(1, 400, "ValidationException")
		msgs := publishtest.Messages(3, 64)
		results := b.publisher.Publish(context.Background(), msgs)
		for i, r := range results {
			if r.Kind != publish.Delivered {
				t.Errorf("message %d: %s %s %v, want delivered once sent alone", i, r.Kind, r.Code, r.Err)
			}
		}
		if n := b.fake.Requests(); n != 4 {
			t.Errorf("%d calls, want 4: the refused call, then one per entry", n)
		}
	})

	t.Run("a route cap above the account's", func(t *testing.T) {
		t.Parallel()
		// The route says 4,000 bytes; the account (the fake) takes 1,000 a
		// request. Entries of 600 bytes pass alone; the 1,500-byte one
		// cannot pass at all.
		b := setup(t, eventbridge.Config{MaxEntryBytes: 4000})
		b.fake.SetMaxRequestBytes(1000)
		msgs := []*outboxtype.Message{
			publishtest.Message(0, 600-conformanceOverhead),
			publishtest.Message(1, 600-conformanceOverhead),
			publishtest.Message(2, 1500-conformanceOverhead),
			publishtest.Message(3, 600-conformanceOverhead),
		}
		results := b.publisher.Publish(context.Background(), msgs)
		for i, r := range results {
			if i == 2 {
				var apiErr interface{ ErrorCode() string }
				if r.Kind != publish.Terminal || r.Code != outboxtype.CodeInvalidPayload || !errors.As(r.Err, &apiErr) || apiErr.ErrorCode() != "ValidationException" {
					t.Errorf("the oversize message: %s %s %v, want terminal INVALID_PAYLOAD from ValidationException", r.Kind, r.Code, r.Err)
				}
				continue
			}
			if r.Kind != publish.Delivered {
				t.Errorf("message %d: %s %s %v, want delivered", i, r.Kind, r.Code, r.Err)
			}
		}
		if n := b.fake.Requests(); n != 5 {
			t.Errorf("%d calls, want 5", n)
		}
	})
}

func TestShortAnswerLeavesTheMissingEntriesRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t, eventbridge.Config{})
	b.fake.OmitResults(1, 3)
	msgs := publishtest.Messages(10, 64)
	results := b.publisher.Publish(context.Background(), msgs)
	for i, r := range results {
		if i < 7 {
			if r.Kind != publish.Delivered || r.TargetRef == "" {
				t.Errorf("message %d: %s %s %v, want delivered", i, r.Kind, r.Code, r.Err)
			}
			continue
		}
		if r.Kind != publish.Retryable || r.Code != outboxtype.CodeTarget5xx || !errors.Is(r.Err, eventbridge.ErrMissingResult) {
			t.Errorf("message %d: %s %s %v, want retryable TARGET_5XX for a missing result", i, r.Kind, r.Code, r.Err)
		}
	}
}

func TestCallTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	b := setup(t, eventbridge.Config{Timeout: timeout})
	b.fake.Stall()
	msgs := publishtest.Messages(25, 64) // three calls, all in flight at once
	start := time.Now()
	results := b.publisher.Publish(context.Background(), msgs)
	took := time.Since(start)
	// The stalled fake never answers: Publish returning at all is the
	// call timeout at work, and no sooner than it.
	if took < timeout {
		t.Errorf("Publish took %s with a %s call timeout", took, timeout)
	}
	for i, r := range results {
		if r.Kind != publish.Retryable || r.Code != outboxtype.CodeTimeout || !errors.Is(r.Err, context.DeadlineExceeded) {
			t.Errorf("message %d: %s %s %v, want retryable TIMEOUT", i, r.Kind, r.Code, r.Err)
		}
	}
	if n := b.fake.Requests(); n != 3 {
		t.Errorf("%d calls, want 3", n)
	}
}

func TestInvocationEndingFirstIsCanceled(t *testing.T) {
	t.Parallel()
	b := setup(t, eventbridge.Config{Timeout: time.Minute})
	b.fake.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	for i, r := range b.publisher.Publish(ctx, publishtest.Messages(5, 64)) {
		if r.Kind != publish.Retryable || r.Code != outboxtype.CodeCanceled {
			t.Errorf("message %d: %s %s %v, want retryable CANCELED", i, r.Kind, r.Code, r.Err)
		}
	}
}

func TestNetworkFailureIsRetryable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: connection refused
	cfg := eventbridgefake.New(t).Config()
	cfg.BaseEndpoint = aws.String("http://" + addr)
	p, err := eventbridge.New(awseb.NewFromConfig(cfg), eventbridge.Config{EventBus: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range p.Publish(context.Background(), publishtest.Messages(3, 64)) {
		if r.Kind != publish.Retryable || r.Code != outboxtype.CodeNetwork {
			t.Errorf("message %d: %s %s %v, want retryable NETWORK", i, r.Kind, r.Code, r.Err)
		}
	}
}

func TestCorrectWhateverTheSDKRetryerDoes(t *testing.T) {
	t.Parallel()
	newPublisher := func(t *testing.T) testBundle {
		fake := eventbridgefake.New(t)
		cfg := fake.Config()
		// RetryMaxAttempts caps even a custom Retryer in this SDK version.
		cfg.RetryMaxAttempts = 3
		cfg.Retryer = func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = 3
				o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
			})
		}
		p, err := eventbridge.New(awseb.NewFromConfig(cfg), eventbridge.Config{EventBus: "orders"})
		if err != nil {
			t.Fatal(err)
		}
		return testBundle{fake: fake, publisher: p}
	}
	t.Run("a retried 500 is delivered once", func(t *testing.T) {
		t.Parallel()
		b := newPublisher(t)
		b.fake.FailCalls(1, 500, "InternalException")
		msgs := publishtest.Messages(4, 64)
		for i, r := range b.publisher.Publish(context.Background(), msgs) {
			if r.Kind != publish.Delivered {
				t.Errorf("message %d: %s %s %v, want delivered", i, r.Kind, r.Code, r.Err)
			}
		}
		if n := b.fake.Requests(); n != 2 {
			t.Errorf("%d calls, want 2 (one SDK retry)", n)
		}
		if n := len(byMessage(t, b.fake)); n != 4 {
			t.Errorf("%d accepted, want 4", n)
		}
	})
	t.Run("throttling past the SDK's attempts is retryable", func(t *testing.T) {
		t.Parallel()
		b := newPublisher(t)
		b.fake.FailCalls(3, 400, "ThrottlingException")
		for i, r := range b.publisher.Publish(context.Background(), publishtest.Messages(4, 64)) {
			if r.Kind != publish.Retryable || r.Code != outboxtype.CodeThrottled {
				t.Errorf("message %d: %s %s %v, want retryable THROTTLED", i, r.Kind, r.Code, r.Err)
			}
		}
		if n := b.fake.Requests(); n != 3 {
			t.Errorf("%d calls, want 3", n)
		}
	})
}

func TestEntrySizeFormulaAndCap(t *testing.T) {
	t.Parallel()
	const limit = 1000
	t.Run("exactly at the cap is sent, a byte over is not", func(t *testing.T) {
		t.Parallel()
		b := setup(t, eventbridge.Config{MaxEntryBytes: limit})
		b.fake.SetMaxRequestBytes(limit) // the fake's own formula must agree
		msgs := []*outboxtype.Message{
			publishtest.Message(0, limit-conformanceOverhead),
			publishtest.Message(1, limit-conformanceOverhead+1),
		}
		results := b.publisher.Publish(context.Background(), msgs)
		if r := results[0]; r.Kind != publish.Delivered {
			t.Errorf("entry at the cap: %s %s %v, want delivered", r.Kind, r.Code, r.Err)
		}
		if r := results[1]; r.Kind != publish.Terminal || r.Code != outboxtype.CodePayloadTooLarge || !errors.Is(r.Err, eventbridge.ErrEntryTooLarge) {
			t.Errorf("entry a byte over: %s %s %v, want terminal PAYLOAD_TOO_LARGE", r.Kind, r.Code, r.Err)
		}
		if n := b.fake.Requests(); n != 1 {
			t.Errorf("%d calls, want 1", n)
		}
	})

	t.Run("bytes, not characters; Time counts 14 only when set", func(t *testing.T) {
		t.Parallel()
		b := setup(t, eventbridge.Config{MaxEntryBytes: limit, Source: "ünïcödé.{namespace}"})
		b.fake.SetMaxRequestBytes(limit)
		source := len("ünïcödé.conformance") // 23 bytes, 19 characters
		withTime := utf8Payload(limit - source - len("suite") - 14)
		withoutTime := utf8Payload(limit - source - len("suite"))
		withoutTime.CreatedAt = time.Time{}
		over := utf8Payload(limit - source - len("suite") - 14 + 1)
		results := b.publisher.Publish(context.Background(), []*outboxtype.Message{withTime, withoutTime, over})
		for i, want := range []publish.Kind{publish.Delivered, publish.Delivered, publish.Terminal} {
			if results[i].Kind != want {
				t.Errorf("message %d: %s %s %v, want %s", i, results[i].Kind, results[i].Code, results[i].Err, want)
			}
		}
		got := byMessage(t, b.fake)
		if e := got[withoutTime.ID]; !e.Time.IsZero() {
			t.Errorf("a message without CreatedAt was sent with Time %s", e.Time)
		}
	})

	t.Run("request totals split across calls", func(t *testing.T) {
		t.Parallel()
		b := setup(t, eventbridge.Config{MaxEntryBytes: limit})
		b.fake.SetMaxRequestBytes(limit)
		// 500 + 500 fills a call exactly; the third starts the next.
		msgs := publishtest.Messages(3, 500-conformanceOverhead)
		for i, r := range b.publisher.Publish(context.Background(), msgs) {
			if r.Kind != publish.Delivered {
				t.Errorf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
			}
		}
		if n := b.fake.Requests(); n != 2 {
			t.Errorf("%d calls for 500+500+500 bytes under a 1,000-byte cap, want 2", n)
		}
		// 400 each: two per call, so five take three calls.
		b2 := setup(t, eventbridge.Config{MaxEntryBytes: limit})
		b2.fake.SetMaxRequestBytes(limit)
		b2.publisher.Publish(context.Background(), publishtest.Messages(5, 400-conformanceOverhead))
		if n, accepted := b2.fake.Requests(), len(b2.fake.Received()); n != 3 || accepted != 5 {
			t.Errorf("%d calls, %d accepted for five 400-byte entries, want 3 and 5", n, accepted)
		}
	})

	t.Run("at most 10 entries a call", func(t *testing.T) {
		t.Parallel()
		b := setup(t, eventbridge.Config{})
		b.publisher.Publish(context.Background(), publishtest.Messages(25, 32))
		if n, accepted := b.fake.Requests(), len(b.fake.Received()); n != 3 || accepted != 25 {
			t.Errorf("%d calls, %d accepted for 25 messages, want 3 and 25", n, accepted)
		}
	})
}

// utf8Payload is a publishtest message whose payload is exactly n bytes,
// padded with two-byte characters where it can be.
func utf8Payload(n int) *outboxtype.Message {
	m := publishtest.Message(0, 0)
	head := fmt.Sprintf(`{"msg_id":%q,"pad":"`, m.ID)
	pad := n - len(head) - len(`"}`)
	m.Payload = json.RawMessage(head + strings.Repeat("é", pad/2) + strings.Repeat("x", pad%2) + `"}`)
	return m
}

func TestEntryFields(t *testing.T) {
	t.Parallel()
	const bus = "arn:aws:events:eu-west-1:123456789012:event-bus/billing"
	b := setup(t, eventbridge.Config{EventBus: bus, Source: "com.example.{namespace}", DetailType: "{namespace}/{topic}.v1"})
	msgs := publishtest.Messages(3, 64)
	msgs[0].TraceHeader = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
	msgs[1].TraceHeader = "Root=1-67891233-abcdef012345678912345678;Sampled=0"
	msgs[2].Namespace, msgs[2].Topic = "payments", "refund_issued"
	tooLong := publishtest.Message(3, 64)
	tooLong.TraceHeader = strings.Repeat("t", 501)
	msgs = append(msgs, tooLong)

	for i, r := range b.publisher.Publish(context.Background(), msgs) {
		if r.Kind != publish.Delivered {
			t.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
		}
	}
	got := byMessage(t, b.fake)
	for i, m := range msgs {
		e := got[m.ID]
		wantTrace := m.TraceHeader
		if m == tooLong {
			wantTrace = "" // EventBridge would refuse the whole request for it
		}
		want := eventbridgefake.Entry{
			EventBusName: bus,
			Source:       "com.example." + m.Namespace,
			DetailType:   m.Namespace + "/" + m.Topic + ".v1",
			Detail:       string(m.Payload),
			Time:         m.CreatedAt.Truncate(time.Millisecond).UTC(),
			TraceHeader:  wantTrace,
			EventID:      e.EventID,
		}
		if fmt.Sprint(e) != fmt.Sprint(want) {
			t.Errorf("message %d sent as\n %+v\nwant\n %+v", i, e, want)
		}
	}
}

func TestRefusedBeforeAnyCall(t *testing.T) {
	t.Parallel()
	b := setup(t, eventbridge.Config{Source: "{namespace}"})
	message := func(mutate func(*outboxtype.Message)) *outboxtype.Message {
		m := publishtest.Message(0, 64)
		mutate(m)
		return m
	}
	cases := []struct {
		name     string
		msg      *outboxtype.Message
		sentinel error
		mention  string
	}{
		{"array payload", message(func(m *outboxtype.Message) { m.Payload = json.RawMessage(` [{"a":1}]`) }), eventbridge.ErrDetailNotObject, "JSON array"},
		{"string payload", message(func(m *outboxtype.Message) { m.Payload = json.RawMessage(`"text"`) }), eventbridge.ErrDetailNotObject, "JSON object"},
		{"empty payload", message(func(m *outboxtype.Message) { m.Payload = nil }), eventbridge.ErrDetailNotObject, "empty"},
		{"nil message", nil, eventbridge.ErrDetailNotObject, "nil message"},
		{"Source too long", message(func(m *outboxtype.Message) { m.Namespace = strings.Repeat("n", 257) }), eventbridge.ErrInvalidSource, "257 characters"},
		{"Source in aws.", message(func(m *outboxtype.Message) { m.Namespace = "aws.ec2" }), eventbridge.ErrInvalidSource, "aws."},
		{"empty Source", message(func(m *outboxtype.Message) { m.Namespace = "" }), eventbridge.ErrInvalidSource, "Source is empty"},
		{"DetailType too long", message(func(m *outboxtype.Message) { m.Topic = strings.Repeat("ü", 129) }), eventbridge.ErrInvalidDetailType, "129 characters"},
		{"empty DetailType", message(func(m *outboxtype.Message) { m.Topic = "" }), eventbridge.ErrInvalidDetailType, "DetailType is empty"},
	}
	msgs := make([]*outboxtype.Message, len(cases))
	for i, c := range cases {
		msgs[i] = c.msg
	}
	results := b.publisher.Publish(context.Background(), msgs)
	for i, c := range cases {
		r := results[i]
		if r.Kind != publish.Terminal || r.Code != outboxtype.CodeInvalidPayload || !errors.Is(r.Err, c.sentinel) || !strings.Contains(r.Err.Error(), c.mention) {
			t.Errorf("%s: %s %s %v, want terminal INVALID_PAYLOAD (%v) mentioning %q", c.name, r.Kind, r.Code, r.Err, c.sentinel, c.mention)
		}
	}
	if n := b.fake.Requests(); n != 0 {
		t.Errorf("%d calls for messages that cannot be sent", n)
	}

	// At the limits exactly, the same fields pass.
	ok := []*outboxtype.Message{
		message(func(m *outboxtype.Message) { m.Namespace = strings.Repeat("n", 256) }),
		message(func(m *outboxtype.Message) { m.Topic = strings.Repeat("ü", 128) }),
	}
	for i, r := range b.publisher.Publish(context.Background(), ok) {
		if r.Kind != publish.Delivered {
			t.Errorf("at the limit %d: %s %s %v, want delivered", i, r.Kind, r.Code, r.Err)
		}
	}
}

func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 3} {
		t.Run(fmt.Sprint(concurrency), func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventbridge.Config{Concurrency: concurrency})
			b.fake.SetLatency(50 * time.Millisecond)
			msgs := publishtest.Messages(100, 64) // ten calls
			for i, r := range b.publisher.Publish(context.Background(), msgs) {
				if r.Kind != publish.Delivered {
					t.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
				}
			}
			if n, most := b.fake.Requests(), b.fake.MaxInFlight(); n != 10 || most != concurrency {
				t.Errorf("%d calls, at most %d in flight; want 10 calls, %d in flight", n, most, concurrency)
			}
		})
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	client := awseb.NewFromConfig(eventbridgefake.New(t).Config())
	cases := []struct {
		cfg     eventbridge.Config
		mention string
	}{
		{eventbridge.Config{}, "Config.EventBus is required"},
		{eventbridge.Config{EventBus: "my bus"}, "Config.EventBus"},
		{eventbridge.Config{EventBus: "arn:aws:sns:us-east-1:123456789012:topic"}, "Config.EventBus"},
		{eventbridge.Config{EventBus: "b", MaxEntryBytes: 2 << 20}, "Config.MaxEntryBytes"},
		{eventbridge.Config{EventBus: "b", MaxEntryBytes: -1}, "Config.MaxEntryBytes"},
		{eventbridge.Config{EventBus: "b", Timeout: -time.Second}, "Config.Timeout"},
		{eventbridge.Config{EventBus: "b", Concurrency: -2}, "Config.Concurrency"},
		{eventbridge.Config{EventBus: "b", Source: "outbox.{namspace}"}, `Config.Source "outbox.{namspace}": "{namspace}" is not a placeholder`},
		{eventbridge.Config{EventBus: "b", Source: "outbox.{namespace"}, "Config.Source"},
		{eventbridge.Config{EventBus: "b", DetailType: "{topic}}"}, `Config.DetailType "{topic}}": the unmatched "}"`},
		{eventbridge.Config{EventBus: "b", Source: "aws.{namespace}"}, "Config.Source"},
		{eventbridge.Config{EventBus: "b", Source: "aws.billing"}, "Config.Source"},
		{eventbridge.Config{EventBus: "b", DetailType: strings.Repeat("d", 129)}, "Config.DetailType"},
		{eventbridge.Config{EventBus: "b", DetailType: strings.Repeat("d", 129) + "{topic}"}, "Config.DetailType"},
	}
	for _, c := range cases {
		_, err := eventbridge.New(client, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("New(%+v): %v, want an error mentioning %q", c.cfg, err, c.mention)
		}
	}
	for _, good := range []eventbridge.Config{
		{EventBus: "default"},
		{EventBus: "arn:aws:events:eu-west-1:123456789012:event-bus/billing-prod.v2"},
		{EventBus: "b", Source: "billing", DetailType: "usage-snapshot", MaxEntryBytes: eventbridge.MaxEntryBytesLimit},
		{EventBus: "b", Source: "{namespace}.{topic}", DetailType: "{topic}{namespace}"},
	} {
		if _, err := eventbridge.New(client, good); err != nil {
			t.Errorf("New(%+v): %v", good, err)
		}
	}
	if _, err := eventbridge.New(nil, eventbridge.Config{EventBus: "b"}); err == nil {
		t.Error("New with a nil client succeeded")
	}
}

// Isolating the entry at fault keeps its key's order: the entries are sent
// alone, in order, and once the bad one fails, the rest of its key is
// released instead of sent; other keys and unordered messages are
// delivered.
func TestIsolationReleasesTheRestOfTheBadEntrysKey(t *testing.T) {
	t.Parallel()
	// The route says 4,000 bytes a request; the account (the fake) takes
	// 1,000. Together the entries are over it; alone, only a2 is.
	b := setup(t, eventbridge.Config{MaxEntryBytes: 4000})
	b.fake.SetMaxRequestBytes(1000)
	entry := func(key string, seq int64, bytes int) *outboxtype.Message {
		m := publishtest.Message(int(seq), bytes-conformanceOverhead)
		m.OrderingKey, m.SequenceID = key, seq
		return m
	}
	a := []*outboxtype.Message{entry("a", 1, 100), entry("a", 2, 1500), entry("a", 3, 100), entry("a", 4, 100)}
	other, unordered := entry("b", 1, 100), publishtest.Message(9, 100-conformanceOverhead)
	msgs := slices.Concat(a, []*outboxtype.Message{other, unordered})
	names := map[uuid.UUID]string{other.ID: "b1", unordered.ID: "u1"}
	for i, m := range a {
		names[m.ID] = fmt.Sprint("a", i+1)
	}

	results := b.publisher.Publish(context.Background(), msgs)

	want := []publish.Kind{publish.Delivered, publish.Terminal, publish.Released, publish.Released, publish.Delivered, publish.Delivered}
	for i, r := range results {
		if r.Kind != want[i] {
			t.Errorf("%s: %s %s %v, want %s", names[msgs[i].ID], r.Kind, r.Code, r.Err, want[i])
		}
	}
	if r := results[1]; r.Code != outboxtype.CodeInvalidPayload {
		t.Errorf("a2: %s %s %v, want INVALID_PAYLOAD", r.Kind, r.Code, r.Err)
	}
	var calls []string
	for _, c := range b.fake.CallIDs() {
		var call []string
		for _, id := range c {
			call = append(call, names[id])
		}
		calls = append(calls, strings.Join(call, " "))
	}
	if wantCalls := []string{"a1 a2 a3 a4 b1 u1", "a1", "a2", "b1", "u1"}; !slices.Equal(calls, wantCalls) {
		t.Errorf("calls\n%q\nwant\n%q", calls, wantCalls)
	}
	accepted := byMessage(t, b.fake)
	for _, m := range a[1:] {
		if _, ok := accepted[m.ID]; ok {
			t.Errorf("%s accepted", names[m.ID])
		}
	}
}
