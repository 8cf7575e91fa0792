package snsfake_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
)

// client is a real SNS client without SDK retries, so that every call the
// test makes is exactly one request.
func client(fake *snsfake.Server) *sns.Client {
	return sns.NewFromConfig(fake.Config(), func(o *sns.Options) { o.Retryer = aws.NopRetryer{} })
}

func entry(id string, outboxID uuid.UUID, body string) types.PublishBatchRequestEntry {
	return types.PublishBatchRequestEntry{
		Id:      aws.String(id),
		Message: aws.String(body),
		MessageAttributes: map[string]types.MessageAttributeValue{
			"outbox.id": {DataType: aws.String("String"), StringValue: aws.String(outboxID.String())},
		},
	}
}

func publish(t *testing.T, fake *snsfake.Server, topic string, entries ...types.PublishBatchRequestEntry) (*sns.PublishBatchOutput, error) {
	t.Helper()
	return client(fake).PublishBatch(context.Background(), &sns.PublishBatchInput{
		TopicArn: aws.String(snsfake.TopicARN(topic)), PublishBatchRequestEntries: entries,
	})
}

// The fake decodes what the SDK's serializer writes — every field and
// attribute type — and the SDK's deserializer reads what the fake answers.
func TestRoundTripThroughTheRealClient(t *testing.T) {
	t.Parallel()
	fake := snsfake.New(t)
	a, b := uuid.New(), uuid.New()
	first := entry("0", a, `{"n":1,"text":"ünïcode & <xml>"}`)
	first.MessageAttributes["count"] = types.MessageAttributeValue{DataType: aws.String("Number"), StringValue: aws.String("42")}
	first.MessageAttributes["blob"] = types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: []byte{0, 1, 2, 255}}
	first.MessageAttributes["kind.custom"] = types.MessageAttributeValue{DataType: aws.String("String.json"), StringValue: aws.String(`{"a":1}`)}
	first.Subject = aws.String("subject")
	second := entry("1", uuid.Nil, fmt.Sprintf(`{"msg_id":%q}`, b))
	second.MessageAttributes = nil

	out, err := publish(t, fake, "orders", first, second)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Successful) != 2 || len(out.Failed) != 0 {
		t.Fatalf("answer: %d successful, %d failed", len(out.Successful), len(out.Failed))
	}
	got := fake.Received()
	if len(got) != 2 {
		t.Fatalf("received %d entries", len(got))
	}
	e := got[0]
	if e.TopicArn != snsfake.TopicARN("orders") || e.ID != "0" || e.Message != aws.ToString(first.Message) || e.Subject != "subject" {
		t.Errorf("entry 0 decoded as %+v", e)
	}
	if e.OutboxID != a || got[1].OutboxID != b {
		t.Errorf("outbox ids %s, %s; want %s (attribute), %s (payload msg_id)", e.OutboxID, got[1].OutboxID, a, b)
	}
	want := map[string]snsfake.Attribute{
		"outbox.id":   {DataType: "String", StringValue: a.String()},
		"count":       {DataType: "Number", StringValue: "42"},
		"blob":        {DataType: "Binary", BinaryValue: []byte{0, 1, 2, 255}},
		"kind.custom": {DataType: "String.json", StringValue: `{"a":1}`},
	}
	if len(e.Attributes) != len(want) {
		t.Errorf("attributes %+v, want %+v", e.Attributes, want)
	}
	for name, w := range want {
		g := e.Attributes[name]
		if g.DataType != w.DataType || g.StringValue != w.StringValue || string(g.BinaryValue) != string(w.BinaryValue) {
			t.Errorf("attribute %s = %+v, want %+v", name, g, w)
		}
	}
	for i, s := range out.Successful {
		if aws.ToString(s.MessageId) != got[i].MessageID || aws.ToString(s.Id) != got[i].ID {
			t.Errorf("successful %d: %s/%s, received %s/%s", i, aws.ToString(s.Id), aws.ToString(s.MessageId), got[i].ID, got[i].MessageID)
		}
	}
	wantSize := len(e.Message) + len("outbox.id") + len("String") + 36 + len("count") + len("Number") + 2 +
		len("blob") + len("Binary") + 4 + len("kind.custom") + len("String.json") + len(`{"a":1}`)
	if e.Size() != wantSize {
		t.Errorf("Size() = %d, want %d", e.Size(), wantSize)
	}
}

func TestFIFOAnswersCarrySequenceNumbers(t *testing.T) {
	t.Parallel()
	fake := snsfake.New(t)
	e := entry("a", uuid.New(), `{}`)
	e.MessageGroupId, e.MessageDeduplicationId = aws.String("g"), aws.String("d")
	out, err := publish(t, fake, "orders.fifo", e)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Successful) != 1 || aws.ToString(out.Successful[0].SequenceNumber) == "" {
		t.Fatalf("answer %+v", out.Successful)
	}
	if got := fake.Received()[0]; got.MessageGroupId != "g" || got.MessageDeduplicationId != "d" {
		t.Errorf("received group %q, dedup %q", got.MessageGroupId, got.MessageDeduplicationId)
	}
}

// Injected failures reach the SDK as the errors SNS's would: typed
// exceptions where the SDK has one, the HTTP status, the Failed entries.
func TestInjectedFailuresDecodeAsSNSErrors(t *testing.T) {
	t.Parallel()
	t.Run("entry failures", func(t *testing.T) {
		fake := snsfake.New(t)
		bad, flaky, good := uuid.New(), uuid.New(), uuid.New()
		fake.FailMessage(snsfake.ID(bad), "InvalidParameter", true)
		fake.FailMessage(snsfake.ID(flaky), "InternalError", false)
		out, err := publish(t, fake, "orders", entry("0", bad, "{}"), entry("1", flaky, "{}"), entry("2", good, "{}"))
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Successful) != 1 || aws.ToString(out.Successful[0].Id) != "2" {
			t.Errorf("successful %+v", out.Successful)
		}
		if len(out.Failed) != 2 {
			t.Fatalf("failed %+v", out.Failed)
		}
		f0, f1 := out.Failed[0], out.Failed[1]
		if aws.ToString(f0.Id) != "0" || aws.ToString(f0.Code) != "InvalidParameter" || !f0.SenderFault {
			t.Errorf("failed[0] = %+v", f0)
		}
		if aws.ToString(f1.Id) != "1" || aws.ToString(f1.Code) != "InternalError" || f1.SenderFault {
			t.Errorf("failed[1] = %+v", f1)
		}
		if ids := fake.ReceivedIDs(); len(ids) != 1 || ids[0] != good {
			t.Errorf("received %v, want only %s", ids, good)
		}
	})

	for _, tc := range []struct {
		status int
		code   string
		typed  any
	}{
		{http.StatusBadRequest, "Throttling", nil},
		{http.StatusForbidden, "AuthorizationError", &types.AuthorizationErrorException{}},
		{http.StatusNotFound, "NotFound", &types.NotFoundException{}},
		{http.StatusInternalServerError, "InternalError", &types.InternalErrorException{}},
		{http.StatusBadRequest, "KMSAccessDenied", &types.KMSAccessDeniedException{}},
	} {
		t.Run(fmt.Sprintf("call failure %d %s", tc.status, tc.code), func(t *testing.T) {
			fake := snsfake.New(t)
			fake.FailCalls(1, tc.status, tc.code)
			_, err := publish(t, fake, "orders", entry("0", uuid.New(), "{}"))
			var apiErr smithy.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode() != tc.code {
				t.Fatalf("error %v, want API error %s", err, tc.code)
			}
			var respErr *awshttp.ResponseError
			if !errors.As(err, &respErr) || respErr.HTTPStatusCode() != tc.status {
				t.Errorf("error %v, want HTTP status %d", err, tc.status)
			}
			wantFault := smithy.FaultClient
			if tc.status >= 500 {
				wantFault = smithy.FaultServer
			}
			if tc.typed != nil && apiErr.ErrorFault() != wantFault {
				t.Errorf("fault %v, want %v", apiErr.ErrorFault(), wantFault)
			}
			if len(fake.Received()) != 0 {
				t.Error("a failed call's entries were received")
			}
			// Only the next call failed.
			if _, err := publish(t, fake, "orders", entry("0", uuid.New(), "{}")); err != nil {
				t.Errorf("second call: %v", err)
			}
		})
	}

	t.Run("calls containing a poisoned entry", func(t *testing.T) {
		fake := snsfake.New(t)
		poison := uuid.New()
		fake.FailCallsContaining(snsfake.ID(poison), http.StatusBadRequest, "InvalidParameter")
		if _, err := publish(t, fake, "orders", entry("0", uuid.New(), "{}"), entry("1", poison, "{}")); err == nil {
			t.Error("a call with the poisoned entry succeeded")
		}
		if _, err := publish(t, fake, "orders", entry("0", uuid.New(), "{}")); err != nil {
			t.Errorf("a call without it failed: %v", err)
		}
	})

	t.Run("omitted entries", func(t *testing.T) {
		fake := snsfake.New(t)
		lost := uuid.New()
		fake.OmitMessage(snsfake.ID(lost))
		out, err := publish(t, fake, "orders", entry("0", lost, "{}"), entry("1", uuid.New(), "{}"))
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Successful) != 1 || len(out.Failed) != 0 || aws.ToString(out.Successful[0].Id) != "1" {
			t.Errorf("answer %+v %+v, want only entry 1", out.Successful, out.Failed)
		}
	})
}

// The fake refuses what SNS refuses, so that tests against it catch a
// publisher that breaks SNS's rules.
func TestEnforcesSNSLimits(t *testing.T) {
	t.Parallel()
	many := func(n int) []types.PublishBatchRequestEntry {
		out := make([]types.PublishBatchRequestEntry, n)
		for i := range out {
			out[i] = entry(fmt.Sprint(i), uuid.New(), "{}")
		}
		return out
	}
	withAttr := func(name, dataType, value string) types.PublishBatchRequestEntry {
		e := entry("0", uuid.New(), "{}")
		e.MessageAttributes[name] = types.MessageAttributeValue{DataType: aws.String(dataType), StringValue: aws.String(value)}
		return e
	}
	fifo := func(group, dedup string) types.PublishBatchRequestEntry {
		e := entry("0", uuid.New(), "{}")
		if group != "" {
			e.MessageGroupId = aws.String(group)
		}
		if dedup != "" {
			e.MessageDeduplicationId = aws.String(dedup)
		}
		return e
	}
	big := entry("0", uuid.New(), `"`+strings.Repeat("x", 600)+`"`)

	for _, tc := range []struct {
		name    string
		topic   string
		entries []types.PublishBatchRequestEntry
		code    string // whole-call error; "" for a per-entry InvalidParameter
	}{
		{"11 entries", "orders", many(11), "TooManyEntriesInBatchRequest"},
		{"duplicate ids", "orders", []types.PublishBatchRequestEntry{entry("a", uuid.New(), "{}"), entry("a", uuid.New(), "{}")}, "BatchEntryIdsNotDistinct"},
		{"bad id", "orders", []types.PublishBatchRequestEntry{entry("a.b", uuid.New(), "{}")}, "InvalidBatchEntryId"},
		{"over the cap", "orders", []types.PublishBatchRequestEntry{big, entry("1", uuid.New(), "{}")}, "BatchRequestTooLong"},
		{"FIFO without a group", "orders.fifo", []types.PublishBatchRequestEntry{fifo("", "d")}, "InvalidParameter"},
		{"FIFO without a deduplication id", "orders.fifo", []types.PublishBatchRequestEntry{fifo("g", "")}, "InvalidParameter"},
		{"FIFO group too long", "orders.fifo", []types.PublishBatchRequestEntry{fifo(strings.Repeat("g", 129), "d")}, "InvalidParameter"},
		{"deduplication id on a standard topic", "orders", []types.PublishBatchRequestEntry{fifo("", "d")}, "InvalidParameter"},
		{"empty message", "orders", []types.PublishBatchRequestEntry{entry("0", uuid.New(), "")}, ""},
		{"reserved attribute prefix", "orders", []types.PublishBatchRequestEntry{withAttr("aws.x", "String", "v")}, ""},
		{"consecutive periods", "orders", []types.PublishBatchRequestEntry{withAttr("a..b", "String", "v")}, ""},
		{"empty attribute value", "orders", []types.PublishBatchRequestEntry{withAttr("a", "String", "")}, ""},
		{"not a number", "orders", []types.PublishBatchRequestEntry{withAttr("a", "Number", "x")}, ""},
		{"control character", "orders", []types.PublishBatchRequestEntry{withAttr("a", "String", "a\x01")}, ""},
		{"11 attributes", "orders", func() []types.PublishBatchRequestEntry {
			e := entry("0", uuid.New(), "{}")
			for i := range 10 {
				e.MessageAttributes[fmt.Sprint("a", i)] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String("v")}
			}
			return []types.PublishBatchRequestEntry{e}
		}(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := snsfake.New(t, snsfake.WithMaxMessageBytes(600))
			out, err := publish(t, fake, tc.topic, tc.entries...)
			if tc.code != "" {
				var apiErr smithy.APIError
				if !errors.As(err, &apiErr) || apiErr.ErrorCode() != tc.code {
					t.Fatalf("error %v, want %s", err, tc.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(out.Failed) != 1 || aws.ToString(out.Failed[0].Code) != "InvalidParameter" || !out.Failed[0].SenderFault {
				t.Errorf("answer %+v, want the entry failed InvalidParameter, sender fault", out.Failed)
			}
			if len(fake.Received()) != 0 {
				t.Error("an invalid entry was received")
			}
		})
	}
}

func TestStallHoldsCallsUntilTheClientGivesUp(t *testing.T) {
	t.Parallel()
	fake := snsfake.New(t)
	fake.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := client(fake).PublishBatch(ctx, &sns.PublishBatchInput{
		TopicArn: aws.String(snsfake.TopicARN("orders")), PublishBatchRequestEntries: []types.PublishBatchRequestEntry{entry("0", uuid.New(), "{}")},
	})
	// A stalled call never answers: the context's deadline is how it ended.
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v, want the context's deadline", err)
	}
	if fake.Requests() != 1 || len(fake.Received()) != 0 {
		t.Errorf("%d requests, %d received; want 1 and 0", fake.Requests(), len(fake.Received()))
	}
	fake.Resume()
	if _, err := publish(t, fake, "orders", entry("0", uuid.New(), "{}")); err != nil {
		t.Errorf("after Resume: %v", err)
	}
}

func TestLatencyDelaysEveryAnswer(t *testing.T) {
	t.Parallel()
	fake := snsfake.New(t)
	fake.SetLatency(50 * time.Millisecond)
	start := time.Now()
	if _, err := publish(t, fake, "orders", entry("0", uuid.New(), "{}")); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Errorf("answered after %s, want at least the 50ms latency", took)
	}
}

func TestDroppedCallsAreConnectionErrors(t *testing.T) {
	t.Parallel()
	fake := snsfake.New(t)
	fake.DropCalls(1)
	_, err := publish(t, fake, "orders", entry("0", uuid.New(), "{}"))
	var sendErr *smithyhttp.RequestSendError
	if !errors.As(err, &sendErr) {
		t.Fatalf("error %v (%T), want a RequestSendError", err, err)
	}
	if _, err := publish(t, fake, "orders", entry("0", uuid.New(), "{}")); err != nil {
		t.Errorf("the call after the dropped one: %v", err)
	}
	calls := fake.Calls()
	if len(calls) != 2 || calls[0].Status != 0 || calls[1].Status != http.StatusOK {
		t.Errorf("calls %+v", calls)
	}
}

func TestEmptyBatchIsRefused(t *testing.T) {
	t.Parallel()
	fake := snsfake.New(t)
	_, err := client(fake).PublishBatch(context.Background(), &sns.PublishBatchInput{
		TopicArn: aws.String(snsfake.TopicARN("orders")), PublishBatchRequestEntries: []types.PublishBatchRequestEntry{},
	})
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "EmptyBatchRequest" {
		t.Errorf("error %v, want EmptyBatchRequest", err)
	}
}

// CallIDs lists every request's messages in request order, whatever its
// answer.
func TestCallIDsListEveryRequest(t *testing.T) {
	t.Parallel()
	fake := snsfake.New(t)
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	if _, err := publish(t, fake, "orders", entry("0", a, "{}"), entry("1", b, "{}")); err != nil {
		t.Fatal(err)
	}
	fake.FailCalls(1, http.StatusInternalServerError, "InternalError")
	if _, err := publish(t, fake, "orders", entry("0", c, "{}")); err == nil {
		t.Fatal("the failed call succeeded")
	}
	got := fake.CallIDs()
	if fmt.Sprint(got) != fmt.Sprint([][]uuid.UUID{{a, b}, {c}}) {
		t.Errorf("CallIDs %v, want [[%s %s] [%s]]", got, a, b, c)
	}
}

// A client without credentials sends its request unsigned; the fake
// refuses it, as SNS does, before reading it.
func TestRefusesUnsignedRequests(t *testing.T) {
	t.Parallel()
	fake := snsfake.New(t)
	cfg := fake.Config()
	cfg.Credentials = nil
	_, err := sns.NewFromConfig(cfg, func(o *sns.Options) { o.Retryer = aws.NopRetryer{} }).PublishBatch(context.Background(), &sns.PublishBatchInput{
		TopicArn: aws.String(snsfake.TopicARN("orders")), PublishBatchRequestEntries: []types.PublishBatchRequestEntry{entry("0", uuid.New(), "{}")},
	})
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "MissingAuthenticationToken" {
		t.Fatalf("error %v, want API error MissingAuthenticationToken", err)
	}
	var respErr *awshttp.ResponseError
	if !errors.As(err, &respErr) || respErr.HTTPStatusCode() != http.StatusForbidden {
		t.Errorf("error %v, want HTTP status 403", err)
	}
	if len(fake.Received()) != 0 {
		t.Error("an unsigned call's entries were received")
	}
	if calls := fake.Calls(); len(calls) != 1 || calls[0].Status != http.StatusForbidden || calls[0].Code != "MissingAuthenticationToken" {
		t.Errorf("calls %+v, want the one refused", calls)
	}
}
