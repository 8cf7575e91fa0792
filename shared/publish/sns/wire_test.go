package sns_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/smithy-go"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// A batch of ten with two entries refused: exactly those two answered as
// SNS said, the other eight delivered, in one call.
func TestBatchOfTenWithTwoEntryFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{})
	msgs := publishtest.Messages(10, 200)
	b.fake.FailMessage(snsfake.ID(msgs[3].ID), "InvalidParameter", true)
	b.fake.FailMessage(snsfake.ID(msgs[7].ID), "InternalError", false)

	results := b.pub.Publish(context.Background(), msgs)

	checkDelivered(t, b.fake, msgs, results, except(3, 7))
	var entryErr *sns.EntryError
	if r := results[3]; r.Kind != publish.Terminal || r.Code != outboxtype.CodeInvalidPayload ||
		!errors.As(r.Err, &entryErr) || entryErr.Code != "InvalidParameter" || !entryErr.SenderFault {
		t.Errorf("message 3: %s %s %v, want terminal INVALID_PAYLOAD from a sender-fault InvalidParameter", r.Kind, r.Code, r.Err)
	}
	if r := results[7]; r.Kind != publish.Retryable || r.Code != outboxtype.CodeTarget5xx ||
		!errors.As(r.Err, &entryErr) || entryErr.Code != "InternalError" || entryErr.SenderFault {
		t.Errorf("message 7: %s %s %v, want retryable TARGET_5XX from an InternalError", r.Kind, r.Code, r.Err)
	}
	if n := b.fake.Requests(); n != 1 {
		t.Errorf("%d requests for a batch of ten, want 1", n)
	}
}

// Per-entry codes, through the SDK's deserializer.
func TestEntryFailureCodes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code        string
		senderFault bool
		kind        publish.Kind
		want        outboxtype.Code
	}{
		{"InternalError", false, publish.Retryable, outboxtype.CodeTarget5xx},
		{"SomethingNew", false, publish.Retryable, outboxtype.CodeTarget5xx},
		{"Throttling", true, publish.Retryable, outboxtype.CodeThrottled},
		{"KMSThrottling", true, publish.Retryable, outboxtype.CodeThrottled},
		{"InvalidParameter", true, publish.Terminal, outboxtype.CodeInvalidPayload},
		{"InvalidParameterValue", true, publish.Terminal, outboxtype.CodeInvalidPayload},
		{"KMSAccessDenied", true, publish.Terminal, outboxtype.CodeAccessDenied},
		{"KMSDisabled", true, publish.Terminal, outboxtype.CodeAccessDenied},
		{"AuthorizationError", true, publish.Terminal, outboxtype.CodeAccessDenied},
		{"SomethingNew", true, publish.Terminal, outboxtype.CodeTargetRejected},
	} {
		t.Run(fmt.Sprintf("%s/senderFault=%t", tc.code, tc.senderFault), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOptions{})
			msgs := publishtest.Messages(3, 64)
			b.fake.FailMessage(snsfake.ID(msgs[1].ID), tc.code, tc.senderFault)
			results := b.pub.Publish(context.Background(), msgs)
			checkDelivered(t, b.fake, msgs, results, except(1))
			if r := results[1]; r.Kind != tc.kind || r.Code != tc.want || r.Err == nil {
				t.Errorf("%s %s %v, want %s %s", r.Kind, r.Code, r.Err, tc.kind, tc.want)
			}
		})
	}
}

// A call that fails whole answers every message alike, whatever the
// client's retryer.
func TestWholeCallFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		code   string
		kind   publish.Kind
		want   outboxtype.Code
	}{
		{http.StatusBadRequest, "Throttling", publish.Retryable, outboxtype.CodeThrottled},
		{http.StatusBadRequest, "ThrottlingException", publish.Retryable, outboxtype.CodeThrottled},
		{http.StatusTooManyRequests, "TooManyRequestsException", publish.Retryable, outboxtype.CodeThrottled},
		{http.StatusInternalServerError, "InternalError", publish.Retryable, outboxtype.CodeTarget5xx},
		{http.StatusServiceUnavailable, "ServiceUnavailable", publish.Retryable, outboxtype.CodeTarget5xx},
		{http.StatusBadGateway, "", publish.Retryable, outboxtype.CodeTarget5xx},
		{http.StatusForbidden, "AuthorizationError", publish.Terminal, outboxtype.CodeAccessDenied},
		{http.StatusForbidden, "AccessDenied", publish.Terminal, outboxtype.CodeAccessDenied},
		{http.StatusForbidden, "InvalidClientTokenId", publish.Terminal, outboxtype.CodeAccessDenied},
		{http.StatusBadRequest, "KMSAccessDenied", publish.Terminal, outboxtype.CodeAccessDenied},
		{http.StatusForbidden, "ExpiredToken", publish.Retryable, outboxtype.CodeAccessDenied},
		{http.StatusNotFound, "NotFound", publish.Terminal, outboxtype.CodeTargetNotFound},
		{http.StatusBadRequest, "SomethingNew", publish.Retryable, outboxtype.CodeTargetRejected},
	} {
		for _, retries := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d %s/sdk retries %t", tc.status, tc.code, retries), func(t *testing.T) {
				t.Parallel()
				b := setup(t, setupOptions{noRetrys: !retries})
				b.fake.FailCalls(100, tc.status, tc.code)
				msgs := publishtest.Messages(12, 64)
				results := b.pub.Publish(context.Background(), msgs)
				checkDelivered(t, b.fake, msgs, results, func(int) bool { return false })
				for i, r := range results {
					if r.Kind != tc.kind || r.Code != tc.want || r.Err == nil {
						t.Errorf("message %d: %s %s %v, want %s %s", i, r.Kind, r.Code, r.Err, tc.kind, tc.want)
					}
					var apiErr smithy.APIError
					if tc.code != "" && (!errors.As(r.Err, &apiErr) || apiErr.ErrorCode() != tc.code) {
						t.Errorf("message %d: error %v does not carry SNS's code %s", i, r.Err, tc.code)
					}
				}
				// Two chunks (10 + 2); the SDK's retryer may try each twice.
				calls := 2
				if retries && tc.kind == publish.Retryable && tc.code != "SomethingNew" && tc.code != "ExpiredToken" {
					calls = 2 * sns.ClientMaxAttempts
				}
				if n := b.fake.Requests(); n != calls {
					t.Errorf("%d requests, want %d", n, calls)
				}
			})
		}
	}
}

// NewClient's retryer absorbs one blip and leaves the rest to the outbox.
func TestClientRetriesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{})
	b.fake.FailCalls(1, http.StatusInternalServerError, "InternalError")
	msgs := publishtest.Messages(3, 64)
	checkDelivered(t, b.fake, msgs, b.pub.Publish(context.Background(), msgs), all)
	if n := b.fake.Requests(); n != 2 {
		t.Errorf("%d requests, want 2: the failed one and the SDK's retry", n)
	}

	b = setup(t, setupOptions{})
	b.fake.FailCalls(2, http.StatusInternalServerError, "InternalError")
	for i, r := range b.pub.Publish(context.Background(), msgs) {
		if r.Kind != publish.Retryable || r.Code != outboxtype.CodeTarget5xx {
			t.Errorf("message %d: %s %s, want retryable TARGET_5XX", i, r.Kind, r.Code)
		}
	}
	if n := b.fake.Requests(); n != sns.ClientMaxAttempts {
		t.Errorf("%d requests, want %d", n, sns.ClientMaxAttempts)
	}
}

// A whole-call InvalidParameter caused by one message: the publisher
// isolates it, so that it alone is terminal and its nine neighbours are
// delivered.
func TestWholeCallInvalidParameterIsolatesTheMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{})
	msgs := publishtest.Messages(10, 64)
	b.fake.FailCallsContaining(snsfake.ID(msgs[6].ID), http.StatusBadRequest, "InvalidParameter")

	results := b.pub.Publish(context.Background(), msgs)

	checkDelivered(t, b.fake, msgs, results, except(6))
	var apiErr smithy.APIError
	if r := results[6]; r.Kind != publish.Terminal || r.Code != outboxtype.CodeInvalidPayload ||
		!errors.As(r.Err, &apiErr) || apiErr.ErrorCode() != "InvalidParameter" {
		t.Errorf("message 6: %s %s %v, want terminal INVALID_PAYLOAD carrying InvalidParameter", r.Kind, r.Code, r.Err)
	}
	// [0,10) fails; [0,5) ok; [5,10) fails; [5,7) fails; [5,6) ok; [6,7)
	// fails alone; [7,10) ok.
	if n := b.fake.Requests(); n != 7 {
		t.Errorf("%d requests, want 7 (halving down to the bad message)", n)
	}
}

// A topic whose real cap is lower than the configured one answers
// BatchRequestTooLong: the publisher halves the chunk until what fits is
// delivered, and a message too large alone is terminal PAYLOAD_TOO_LARGE.
func TestTopicCapLowerThanConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{fake: []snsfake.Option{snsfake.WithMaxMessageBytes(4000)}})
	msgs := publishtest.Messages(10, 1000)
	msgs[4] = publishtest.Message(4, 5000)

	results := b.pub.Publish(context.Background(), msgs)

	checkDelivered(t, b.fake, msgs, results, except(4))
	if r := results[4]; r.Kind != publish.Terminal || r.Code != outboxtype.CodePayloadTooLarge {
		t.Errorf("message 4: %s %s %v, want terminal PAYLOAD_TOO_LARGE", r.Kind, r.Code, r.Err)
	}
	for _, c := range b.fake.Calls() {
		if c.Status == http.StatusOK && c.Bytes > 4000 {
			t.Errorf("a call of %d bytes was accepted over the fake's cap", c.Bytes)
		}
	}
}

// A target that does not answer: every message is a retryable TIMEOUT
// within the configured Timeout, not the invocation's deadline.
func TestSlowTargetTimesOut(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	b := setup(t, setupOptions{cfg: sns.Config{Timeout: timeout}})
	b.fake.Stall()
	msgs := publishtest.Messages(25, 64)

	start := time.Now()
	results := b.pub.Publish(context.Background(), msgs)
	took := time.Since(start)

	// The stalled fake never answers: Publish returning at all is the
	// call timeout at work, and no sooner than it.
	if took < timeout {
		t.Errorf("Publish took %s with a %s timeout", took, timeout)
	}
	for i, r := range results {
		if r.Kind != publish.Retryable || r.Code != outboxtype.CodeTimeout || !strings.Contains(fmt.Sprint(r.Err), "1s") {
			t.Errorf("message %d: %s %s %v, want retryable TIMEOUT naming the 1s timeout", i, r.Kind, r.Code, r.Err)
		}
	}
	if n := len(b.fake.Received()); n != 0 {
		t.Errorf("%d messages received from stalled calls", n)
	}
	// One call per chunk of 10, and no SDK retry after the deadline. A
	// loaded machine may time a call out before it even reached SNS
	// (2 of 3 did, once, beside two busy loops): fewer is no fault.
	if n := b.fake.Requests(); n > 3 {
		t.Errorf("%d requests, want at most 3: one per chunk, no SDK retry after the deadline", n)
	}
}

// When the invocation's context ends midway, what was delivered stays
// delivered, the rest is retryable CANCELED, and chunks not yet started are
// never sent. (A call cut off by the deadline may still have been accepted:
// SNS answered after the client stopped listening. That is the
// at-least-once case a retry turns into a harmless duplicate.)
func TestInvocationEndsMidway(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{cfg: sns.Config{Concurrency: 1}})
	b.fake.SetLatency(500 * time.Millisecond)
	msgs := publishtest.Messages(100, 64) // ten chunks, one at a time: five seconds
	// The invocation ends once the second chunk's call reached SNS: the
	// first was answered by then (one call at a time), and the calls
	// still to come are never sent, however slow the machine.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		defer cancel()
		for b.fake.Requests() < 2 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
	}()

	results := b.pub.Publish(ctx, msgs)

	received := map[string]bool{}
	for _, id := range b.fake.ReceivedIDs() {
		received[id.String()] = true
	}
	var delivered, canceled int
	for i, r := range results {
		switch {
		case r.Kind == publish.Delivered && received[msgs[i].ID.String()]:
			delivered++
		case r.Kind == publish.Retryable && r.Code == outboxtype.CodeCanceled:
			canceled++
		default:
			t.Errorf("message %d: %s %s %v (received %t)", i, r.Kind, r.Code, r.Err, received[msgs[i].ID.String()])
		}
	}
	if delivered == 0 || canceled == 0 {
		t.Errorf("%d delivered, %d canceled; want some of each", delivered, canceled)
	}
	if n := b.fake.Requests(); n >= 10 {
		t.Errorf("%d requests: chunks were sent after the invocation ended", n)
	}
}

// Messages SNS cannot represent are terminal INVALID_PAYLOAD, naming the
// rule and the attribute, and never sent; their neighbours are delivered.
func TestAttributeRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		edit      func(m *outboxtype.Message)
		rule      sns.Rule
		attribute string
	}{
		{"11 attributes", func(m *outboxtype.Message) {
			for i := range 4 { // 6 of the outbox's own + x-suite + 4 = 11
				m.Headers[fmt.Sprint("h", i)] = "v"
			}
		}, sns.RuleTooManyAttributes, ""},
		{"AWS. prefix", func(m *outboxtype.Message) { m.Headers["AWS.trace"] = "v" }, sns.RuleNameReservedPrefix, "AWS.trace"},
		{"amazon. prefix", func(m *outboxtype.Message) { m.Headers["amazon.x"] = "v" }, sns.RuleNameReservedPrefix, "amazon.x"},
		{"leading period", func(m *outboxtype.Message) { m.Headers[".x"] = "v" }, sns.RuleNamePeriods, ".x"},
		{"trailing period", func(m *outboxtype.Message) { m.Headers["x."] = "v" }, sns.RuleNamePeriods, "x."},
		{"consecutive periods", func(m *outboxtype.Message) { m.Headers["a..b"] = "v" }, sns.RuleNamePeriods, "a..b"},
		{"space in name", func(m *outboxtype.Message) { m.Headers["a b"] = "v" }, sns.RuleNameCharacters, "a b"},
		{"name too long", func(m *outboxtype.Message) { m.Headers[strings.Repeat("n", 257)] = "v" }, sns.RuleNameTooLong, strings.Repeat("n", 257)},
		{"outbox. header", func(m *outboxtype.Message) { m.Headers["outbox.id"] = "forged" }, sns.RuleNameOutboxPrefix, "outbox.id"},
		{"empty value", func(m *outboxtype.Message) { m.Headers["empty"] = "" }, sns.RuleEmptyValue, "empty"},
		{"control character", func(m *outboxtype.Message) { m.Headers["bell"] = "ding\x07" }, sns.RuleValueCharacters, "bell"},
		{"bad tenant", func(m *outboxtype.Message) { m.TenantID = "t\x00" }, sns.RuleValueCharacters, "outbox.tenant_id"},
		{"empty namespace", func(m *outboxtype.Message) { m.Namespace = "" }, sns.RuleEmptyValue, "outbox.namespace"},
		{"empty body", func(m *outboxtype.Message) { m.Payload = nil }, sns.RuleEmptyBody, ""},
		{"invalid UTF-8 body", func(m *outboxtype.Message) { m.Payload = []byte("{\"a\":\"\xff\"}") }, sns.RuleBodyCharacters, ""},
		{"first of two bad headers", func(m *outboxtype.Message) { m.Headers["z z"] = "v"; m.Headers["a..a"] = "v" }, sns.RuleNamePeriods, "a..a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOptions{})
			msgs := publishtest.Messages(12, 64)
			tc.edit(msgs[5])

			results := b.pub.Publish(context.Background(), msgs)

			checkDelivered(t, b.fake, msgs, results, except(5))
			r := results[5]
			var invalid *sns.InvalidMessageError
			if r.Kind != publish.Terminal || r.Code != outboxtype.CodeInvalidPayload || !errors.As(r.Err, &invalid) {
				t.Fatalf("%s %s %v, want terminal INVALID_PAYLOAD", r.Kind, r.Code, r.Err)
			}
			if invalid.Rule != tc.rule || invalid.Attribute != tc.attribute {
				t.Errorf("rule %q, attribute %q; want %q, %q", invalid.Rule, invalid.Attribute, tc.rule, tc.attribute)
			}
			if !strings.Contains(r.Err.Error(), string(tc.rule)) || !strings.Contains(r.Err.Error(), tc.attribute) {
				t.Errorf("error %q does not name the rule and the attribute", r.Err)
			}
			for _, c := range b.fake.Calls() {
				for _, e := range c.Entries {
					if e.OutboxID == msgs[5].ID {
						t.Error("the invalid message was sent")
					}
				}
			}
		})
	}
}

// Ten attributes is SNS's limit, and a message at it is sent whole.
func TestTenAttributesAreSent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{})
	m := publishtest.Message(0, 64)
	m.SequenceID, m.OrderingKey, m.TraceHeader = 77, "account-9", "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"
	m.Attempt = 3
	m.Headers["h1"] = "v1" // 8 of the outbox's own + x-suite + h1
	msgs := []*outboxtype.Message{m}
	checkDelivered(t, b.fake, msgs, b.pub.Publish(context.Background(), msgs), all)
	if got := len(b.fake.Received()[0].Attributes); got != 10 {
		t.Errorf("%d attributes received, want 10", got)
	}

	// Absent optional keys are not sent at all.
	bare := publishtest.Message(1, 64)
	bare.TenantID, bare.DedupeKey, bare.Headers = "", "", nil
	msgs = []*outboxtype.Message{bare}
	b = setup(t, setupOptions{})
	checkDelivered(t, b.fake, msgs, b.pub.Publish(context.Background(), msgs), all)
	if got := len(b.fake.Received()[0].Attributes); got != 4 {
		t.Errorf("%d attributes for a message without optional keys, want 4", got)
	}
}

// Chunks hold at most ten entries and stay within the cap; large messages
// make more requests.
func TestChunking(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		cap      int
		count    int
		payload  int
		requests int
	}{
		{"by count", 0, 25, 64, 3},
		{"by size", 10_000, 10, 3000, 4}, // ~3.2 kB each: 3 + 3 + 3 + 1
		{"one per call", 10_000, 4, 6000, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOptions{cfg: sns.Config{MaxMessageBytes: tc.cap}, fake: []snsfake.Option{snsfake.WithMaxMessageBytes(max(tc.cap, snsfake.DefaultMaxMessageBytes))}})
			msgs := publishtest.Messages(tc.count, tc.payload)
			checkDelivered(t, b.fake, msgs, b.pub.Publish(context.Background(), msgs), all)
			calls := b.fake.Calls()
			if len(calls) != tc.requests {
				t.Errorf("%d requests, want %d", len(calls), tc.requests)
			}
			limit := tc.cap
			if limit == 0 {
				limit = sns.DefaultMaxMessageBytes
			}
			for _, c := range calls {
				if len(c.Entries) > 10 || c.Bytes > limit {
					t.Errorf("a request of %d entries and %d bytes (cap %d)", len(c.Entries), c.Bytes, limit)
				}
			}
		})
	}
}

// The cap counts the body and the attributes as SNS does: a message exactly
// at it is sent, a byte over is PAYLOAD_TOO_LARGE without a call.
func TestMessageSizeCap(t *testing.T) {
	t.Parallel()
	m := publishtest.Message(0, 5000)
	size := snsSize(m)
	for _, tc := range []struct {
		cap       int
		delivered bool
	}{{size, true}, {size - 1, false}} {
		b := setup(t, setupOptions{cfg: sns.Config{MaxMessageBytes: tc.cap}})
		results := b.pub.Publish(context.Background(), []*outboxtype.Message{m})
		if tc.delivered {
			checkDelivered(t, b.fake, []*outboxtype.Message{m}, results, all)
			if got := b.fake.Calls()[0].Bytes; got != size {
				t.Errorf("the fake counted %d bytes, the test %d", got, size)
			}
			continue
		}
		var tooLarge *sns.TooLargeError
		if r := results[0]; r.Kind != publish.Terminal || r.Code != outboxtype.CodePayloadTooLarge || !errors.As(r.Err, &tooLarge) || tooLarge.Size != size {
			t.Errorf("cap %d: %s %s %v, want terminal PAYLOAD_TOO_LARGE of %d bytes", tc.cap, r.Kind, r.Code, r.Err, size)
		}
		if n := b.fake.Requests(); n != 0 {
			t.Errorf("cap %d: %d requests for a message over the cap", tc.cap, n)
		}
	}
}

func hexSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// FIFO ids: the ordering key or the default group; the scoped dedupe key or
// the id; hashed, deterministically, when they do not fit.
func TestFIFOIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{cfg: sns.Config{TopicARN: snsfake.TopicARN(fifoTopic), DefaultGroupID: "payments-default"}})
	longKey := strings.Repeat("k", 200)
	msgs := publishtest.Messages(5, 64)
	msgs[0].OrderingKey = "account-1"
	msgs[1].DedupeKey = "" // id as deduplication id, default group
	msgs[2].OrderingKey = longKey
	msgs[3].OrderingKey, msgs[3].DedupeKey = "has space", "ünicode-key"
	msgs[4].DedupeKey = strings.Repeat("d", 128) // fits alone, not scoped
	want := []struct{ group, dedup string }{
		{"account-1", "conformance|suite|" + msgs[0].DedupeKey},
		{"payments-default", msgs[1].ID.String()},
		{hexSHA256(longKey), "conformance|suite|" + msgs[2].DedupeKey},
		{hexSHA256("has space"), hexSHA256("conformance|suite|ünicode-key")},
		{"payments-default", hexSHA256("conformance|suite|" + msgs[4].DedupeKey)},
	}

	// Twice: a retry must carry the same ids, or SNS would not deduplicate.
	for attempt := 1; attempt <= 2; attempt++ {
		results := b.pub.Publish(context.Background(), msgs)
		for i, r := range results {
			if r.Kind != publish.Delivered {
				t.Fatalf("attempt %d, message %d: %s %s %v", attempt, i, r.Kind, r.Code, r.Err)
			}
		}
	}
	got := b.fake.Received()
	if len(got) != 2*len(msgs) {
		t.Fatalf("received %d entries, want %d", len(got), 2*len(msgs))
	}
	for k, e := range got {
		i := k % len(msgs)
		if e.OutboxID != msgs[i].ID {
			t.Fatalf("entry %d is message %s, want %s", k, e.OutboxID, msgs[i].ID)
		}
		if e.MessageGroupId != want[i].group || e.MessageDeduplicationId != want[i].dedup {
			t.Errorf("message %d (attempt %d): group %q dedup %q, want %q %q", i, k/len(msgs)+1, e.MessageGroupId, e.MessageDeduplicationId, want[i].group, want[i].dedup)
		}
	}
}

func TestStandardTopicSendsNoFIFOIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{})
	msgs := publishtest.Messages(3, 64)
	msgs[0].OrderingKey = "account-1"
	checkDelivered(t, b.fake, msgs, b.pub.Publish(context.Background(), msgs), all)
	for _, e := range b.fake.Received() {
		if e.MessageGroupId != "" || e.MessageDeduplicationId != "" {
			t.Errorf("standard topic got group %q, dedup %q", e.MessageGroupId, e.MessageDeduplicationId)
		}
	}
}

// At most Concurrency calls are in flight, and that many are.
func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 3, 8} {
		t.Run(fmt.Sprint(concurrency), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOptions{cfg: sns.Config{Concurrency: concurrency}})
			// Each call held long enough that the calls the bound lets
			// through overlap even on a loaded machine; whether every one
			// of them does is the scheduler's business, so the test asserts
			// the bound, and that calls do run side by side under it.
			b.fake.SetLatency(200 * time.Millisecond)
			msgs := publishtest.Messages(100, 64) // ten chunks
			checkDelivered(t, b.fake, msgs, b.pub.Publish(context.Background(), msgs), all)
			got := b.fake.MaxInFlight()
			if got > concurrency {
				t.Errorf("%d calls in flight at once, above the bound of %d", got, concurrency)
			}
			if want := min(concurrency, 2); got < want {
				t.Errorf("at most %d calls in flight with a bound of %d: the calls did not run side by side", got, concurrency)
			}
		})
	}
}

func TestNetworkErrors(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, results []publish.Result) {
		t.Helper()
		for i, r := range results {
			if r.Kind != publish.Retryable || r.Code != outboxtype.CodeNetwork {
				t.Errorf("message %d: %s %s %v, want retryable NETWORK", i, r.Kind, r.Code, r.Err)
			}
		}
	}
	t.Run("dropped connections", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{})
		b.fake.DropCalls(100)
		msgs := publishtest.Messages(5, 64)
		results := b.pub.Publish(context.Background(), msgs)
		check(t, results)
		checkDelivered(t, b.fake, msgs, results, func(int) bool { return false })
	})
	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		cfg := snsfake.New(t).Config()
		cfg.BaseEndpoint = aws.String("http://" + addr)
		pub, err := sns.New(sns.NewClient(cfg, 8), sns.Config{TopicARN: snsfake.TopicARN(standardTopic)})
		if err != nil {
			t.Fatal(err)
		}
		check(t, pub.Publish(context.Background(), publishtest.Messages(5, 64)))
	})
	t.Run("unknown host", func(t *testing.T) {
		t.Parallel()
		cfg := snsfake.New(t).Config()
		cfg.BaseEndpoint = aws.String("http://sns.invalid")
		pub, err := sns.New(sns.NewClient(cfg, 8, func(o *awssns.Options) { o.Retryer = aws.NopRetryer{} }), sns.Config{TopicARN: snsfake.TopicARN(standardTopic)})
		if err != nil {
			t.Fatal(err)
		}
		check(t, pub.Publish(context.Background(), publishtest.Messages(2, 64)))
	})
}

// An entry SNS answers in neither list is retryable, never dropped.
func TestEntryMissingFromTheAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{})
	msgs := publishtest.Messages(4, 64)
	b.fake.OmitMessage(snsfake.ID(msgs[2].ID))
	results := b.pub.Publish(context.Background(), msgs)
	if r := results[2]; r.Kind != publish.Retryable || r.Code != outboxtype.CodeTarget5xx || r.Err == nil {
		t.Errorf("message 2: %s %s %v, want retryable TARGET_5XX", r.Kind, r.Code, r.Err)
	}
	for _, i := range []int{0, 1, 3} {
		if results[i].Kind != publish.Delivered {
			t.Errorf("message %d: %s", i, results[i].Kind)
		}
	}
}

// Results follow their messages when invalid ones are interleaved with
// valid ones across several chunks and concurrent calls.
func TestResultsFollowTheirMessages(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{cfg: sns.Config{Concurrency: 4}})
	b.fake.SetLatency(5 * time.Millisecond)
	msgs := publishtest.Messages(57, 64)
	var bad []int
	for i := 0; i < len(msgs); i += 7 {
		msgs[i].Headers["AWS.bad"] = "v"
		bad = append(bad, i)
	}
	msgs = append(msgs, nil)
	bad = append(bad, len(msgs)-1)
	results := b.pub.Publish(context.Background(), msgs)
	for _, i := range bad {
		if results[i].Kind != publish.Terminal || results[i].Code != outboxtype.CodeInvalidPayload {
			t.Errorf("message %d: %s %s, want terminal INVALID_PAYLOAD", i, results[i].Kind, results[i].Code)
		}
	}
	checkDelivered(t, b.fake, msgs[:len(msgs)-1], results[:len(msgs)-1], except(bad...))
}

// NewClient keeps an idle connection for every call in flight, so calls
// reuse connections instead of opening (and, against SNS, handshaking) new
// ones; net/http's default of 2 idle connections per host churns them.
func TestConnectionPoolHoldsTheCallsInFlight(t *testing.T) {
	t.Parallel()
	const concurrency = 16
	publishRounds := func(t *testing.T, fake *snsfake.Server, client sns.API) {
		t.Helper()
		pub, err := sns.New(client, sns.Config{TopicARN: snsfake.TopicARN(standardTopic), Concurrency: concurrency})
		if err != nil {
			t.Fatal(err)
		}
		fake.SetLatency(10 * time.Millisecond)
		msgs := publishtest.Messages(10*concurrency*3, 64) // three rounds of calls
		for range 3 {
			for i, r := range pub.Publish(context.Background(), msgs) {
				if r.Kind != publish.Delivered {
					t.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
				}
			}
		}
		// At most Concurrency; fewer only when the machine is too busy to
		// start every call before the first ones return.
		if got := fake.MaxInFlight(); got > concurrency || got < concurrency/2 {
			t.Fatalf("%d calls in flight, want at most %d (and most of them)", got, concurrency)
		}
	}

	fake := snsfake.New(t)
	publishRounds(t, fake, sns.NewClient(fake.Config(), concurrency))
	// A call may start before the previous call's connection is back in the
	// pool; the transport then dials while it waits, and keeps the spare.
	// So a few more than the calls in flight, never a stream of new ones.
	pooled := fake.Connections()
	t.Logf("NewClient: %d connections", pooled)
	if pooled > concurrency+concurrency/2 {
		t.Errorf("NewClient opened %d connections for %d calls in flight", pooled, concurrency)
	}

	// The control: a client on a plain transport opens far more, which is
	// what makes the pool size matter.
	fake = snsfake.New(t)
	cfg := fake.Config()
	cfg.HTTPClient = &http.Client{Transport: &http.Transport{}}
	publishRounds(t, fake, sns.NewClient(cfg, concurrency))
	t.Logf("plain transport: %d connections", fake.Connections())
	if got := fake.Connections(); got < pooled+concurrency {
		t.Errorf("a default transport opened %d connections, NewClient's %d; the control does not show churn", got, pooled)
	}
}

// namesOf spells every call the fake received as its messages' names, for
// comparing call sequences.
func namesOf(fake *snsfake.Server, names map[uuid.UUID]string) []string {
	var calls []string
	for _, c := range fake.CallIDs() {
		var call []string
		for _, id := range c {
			call = append(call, names[id])
		}
		calls = append(calls, strings.Join(call, " "))
	}
	return calls
}

// Isolating a bad entry keeps its key's order: the halves go in order, and
// once the bad entry fails alone, the rest of its key is released instead of
// sent in a later half; the unordered messages beside it are delivered.
func TestIsolationReleasesTheRestOfTheBadEntrysKey(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{cfg: sns.Config{TopicARN: snsfake.TopicARN(fifoTopic)}})
	a, u := publishtest.OrderedMessages("account-1", 6, 64), publishtest.Messages(4, 64)
	msgs := slices.Concat(a, u)
	names := map[uuid.UUID]string{}
	for i, m := range a {
		names[m.ID] = fmt.Sprint("a", i+1)
	}
	for i, m := range u {
		names[m.ID] = fmt.Sprint("u", i+1)
	}
	b.fake.FailCallsContaining(snsfake.ID(a[1].ID), http.StatusBadRequest, "InvalidParameter")

	results := b.pub.Publish(context.Background(), msgs)

	checkDelivered(t, b.fake, msgs, results, func(i int) bool { return i == 0 || i >= len(a) })
	if r := results[1]; r.Kind != publish.Terminal || r.Code != outboxtype.CodeInvalidPayload {
		t.Errorf("a2: %s %s %v, want terminal INVALID_PAYLOAD", r.Kind, r.Code, r.Err)
	}
	for i := 2; i < len(a); i++ {
		if r := results[i]; r.Kind != publish.Released || r.Latency != 0 {
			t.Errorf("a%d: %s %s %v, latency %s; want released", i+1, r.Kind, r.Code, r.Err, r.Latency)
		}
	}
	// [a1…u4] fails; [a1…a5] fails; [a1 a2] fails; [a1] ok; [a2] fails
	// alone, which stops the key: [a3 a4 a5] is not sent, and of
	// [a6 u1…u4] only the unordered ones are.
	want := []string{"a1 a2 a3 a4 a5 a6 u1 u2 u3 u4", "a1 a2 a3 a4 a5", "a1 a2", "a1", "a2", "u1 u2 u3 u4"}
	if got := namesOf(b.fake, names); !slices.Equal(got, want) {
		t.Errorf("calls\n%q\nwant\n%q", got, want)
	}
}

// On a FIFO topic, which publishes a batch's entries in order within a
// message group, a key's entries in one call are consecutive and in
// sequence order, and a key's later call is made only once its earlier one
// was answered.
func TestFIFOKeysGoInSequenceOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOptions{cfg: sns.Config{TopicARN: snsfake.TopicARN(fifoTopic)}})
	b.fake.SetLatency(10 * time.Millisecond)
	msgs := slices.Concat(publishtest.OrderedMessages("account-1", 25, 64), publishtest.OrderedMessages("account-2", 4, 64), publishtest.Messages(5, 64))
	slices.Reverse(msgs)

	checkDelivered(t, b.fake, msgs, b.pub.Publish(context.Background(), msgs), all)

	last := map[string]int64{}
	for i, c := range b.fake.Calls() {
		var groups []string
		for _, e := range c.Entries {
			group := e.MessageGroupId
			if group == "outbox" {
				continue // the default group: messages without a key
			}
			if len(groups) > 0 && groups[len(groups)-1] != group && slices.Contains(groups, group) {
				t.Errorf("call %d: the entries of group %s are not consecutive", i, group)
			}
			groups = append(groups, group)
			seq, _ := strconv.ParseInt(e.Attributes["outbox.sequence_id"].StringValue, 10, 64)
			if seq <= last[group] {
				t.Errorf("call %d: group %s sequence id %d after %d", i, group, seq, last[group])
			}
			last[group] = seq
		}
	}
	if n := b.fake.Requests(); n < 3 {
		t.Errorf("%d requests for a key of 25 messages, want at least 3 one after another", n)
	}
}
