package eventbridgefake_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/smithy-go"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
)

func entry(detail string) types.PutEventsRequestEntry {
	return types.PutEventsRequestEntry{
		EventBusName: aws.String("bus"), Source: aws.String("src"), DetailType: aws.String("type"), Detail: aws.String(detail),
	}
}

func put(t *testing.T, fake *eventbridgefake.Server, entries ...types.PutEventsRequestEntry) (*eventbridge.PutEventsOutput, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return eventbridge.NewFromConfig(fake.Config()).PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries})
}

func TestDecodesWhatTheSDKSends(t *testing.T) {
	fake := eventbridgefake.New(t)
	at := time.Date(2025, 3, 4, 5, 6, 7, 891_000_000, time.UTC)
	e := entry(`{"msg_id":"0195f1a2-0000-7000-8000-000000000001","amount":12}`)
	e.Time = aws.Time(at)
	e.TraceHeader = aws.String("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1")
	e.Resources = []string{"arn:aws:s3:::bucket"}
	out, err := put(t, fake, e)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Entries) != 1 || aws.ToString(out.Entries[0].EventId) == "" || out.FailedEntryCount != 0 {
		t.Fatalf("answer %+v", out)
	}
	got := fake.Received()
	if len(got) != 1 {
		t.Fatalf("received %d entries", len(got))
	}
	want := eventbridgefake.Entry{
		EventBusName: "bus", Source: "src", DetailType: "type", Detail: *e.Detail, Time: at,
		TraceHeader: *e.TraceHeader, Resources: e.Resources, EventID: *out.Entries[0].EventId,
	}
	if fmt.Sprint(got[0]) != fmt.Sprint(want) {
		t.Errorf("received\n %+v\nwant\n %+v", got[0], want)
	}
	if id := got[0].MessageID(); id.String() != "0195f1a2-0000-7000-8000-000000000001" {
		t.Errorf("MessageID %s", id)
	}
	if fake.Requests() != 1 {
		t.Errorf("Requests %d", fake.Requests())
	}
}

func TestPerEntryFaultsAndValidation(t *testing.T) {
	fake := eventbridgefake.New(t)
	id := uuid.New()
	fake.FailMessage(id, "InternalFailure", "try again")
	fake.FailEntries(func(e eventbridgefake.Entry) bool { return strings.Contains(e.Detail, "poison") }, "InvalidArgument", "no")
	out, err := put(t, fake,
		entry(`{"ok":1}`),
		entry(fmt.Sprintf(`{"msg_id":%q}`, id)),
		entry(`{"poison":true}`),
		entry(`[1,2]`),
		entry(`not json`),
		types.PutEventsRequestEntry{Source: aws.String("s"), Detail: aws.String(`{}`)},
	)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"", "InternalFailure", "InvalidArgument", "MalformedDetail", "MalformedDetail", "InvalidArgument"}
	if len(out.Entries) != len(want) || out.FailedEntryCount != 5 {
		t.Fatalf("answer %d entries, %d failed", len(out.Entries), out.FailedEntryCount)
	}
	for i, w := range want {
		if got := aws.ToString(out.Entries[i].ErrorCode); got != w || (w == "") != (out.Entries[i].EventId != nil) {
			t.Errorf("entry %d: code %q event id %v, want code %q", i, got, out.Entries[i].EventId, w)
		}
	}
	if n := len(fake.Received()); n != 1 {
		t.Errorf("%d entries accepted, want 1", n)
	}
}

func TestWholeCallFaultsReachTheSDKAsAWSErrors(t *testing.T) {
	fake := eventbridgefake.New(t)
	fake.FailCalls(1, 400, "ThrottlingException")
	fake.FailCalls(1, 500, "com.amazonaws.eventbridge#InternalException")
	fake.FailCalls(1, 502, "")
	for _, want := range []struct {
		status int
		code   string
	}{{400, "ThrottlingException"}, {500, "InternalException"}, {502, "UnknownError"}} {
		_, err := put(t, fake, entry(`{}`))
		var apiErr smithy.APIError
		var respErr *awshttp.ResponseError
		if !errors.As(err, &apiErr) || !errors.As(err, &respErr) {
			t.Fatalf("%v: not an API error with an HTTP response", err)
		}
		if apiErr.ErrorCode() != want.code || respErr.HTTPStatusCode() != want.status {
			t.Errorf("got %s %d, want %s %d", apiErr.ErrorCode(), respErr.HTTPStatusCode(), want.code, want.status)
		}
	}
	if _, err := put(t, fake, entry(`{}`)); err != nil {
		t.Errorf("after the queued faults: %v", err)
	}
	if n := len(fake.Received()); n != 1 {
		t.Errorf("%d entries accepted, want only the last call's", n)
	}
}

func TestClearFaults(t *testing.T) {
	fake := eventbridgefake.New(t)
	id := uuid.New()
	fake.FailMessage(id, "InternalFailure", "x")
	fake.FailEntries(func(eventbridgefake.Entry) bool { return true }, "InvalidArgument", "y")
	fake.FailCalls(3, 500, "InternalException")
	fake.OmitResults(3, 1)
	fake.ClearFaults()
	out, err := put(t, fake, entry(fmt.Sprintf(`{"msg_id":%q}`, id)), entry(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Entries) != 2 || out.FailedEntryCount != 0 || len(fake.ReceivedIDs()) != 2 || fake.ReceivedIDs()[0] != id {
		t.Errorf("after ClearFaults: %d result entries, %d failed, received %v", len(out.Entries), out.FailedEntryCount, fake.ReceivedIDs())
	}
}

func TestRequestLimits(t *testing.T) {
	fake := eventbridgefake.New(t)
	fake.SetMaxRequestBytes(100)
	// 3 + 4 + 50 + 14 = 71 per entry: one fits, two do not.
	e := entry(`{"p":"` + strings.Repeat("x", 50-8) + `"}`)
	e.Source, e.DetailType, e.Time = aws.String("abc"), aws.String("abcd"), aws.Time(time.Now())
	if _, err := put(t, fake, e); err != nil {
		t.Fatalf("one entry of 71 bytes under a 100-byte cap: %v", err)
	}
	_, err := put(t, fake, e, e)
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "ValidationException" {
		t.Errorf("two entries of 71 bytes under a 100-byte cap: %v, want ValidationException", err)
	}
	many := make([]types.PutEventsRequestEntry, 11)
	for i := range many {
		many[i] = entry(`{}`)
	}
	if _, err := put(t, fake, many...); !errors.As(err, &apiErr) || apiErr.ErrorCode() != "ValidationException" {
		t.Errorf("11 entries: %v, want ValidationException", err)
	}
	other, err := eventbridge.NewFromConfig(fake.Config()).ListEventBuses(context.Background(), &eventbridge.ListEventBusesInput{})
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "UnknownOperationException" {
		t.Errorf("ListEventBuses: %v %v, want UnknownOperationException", other, err)
	}
}

func TestOmitResults(t *testing.T) {
	fake := eventbridgefake.New(t)
	fake.OmitResults(1, 2)
	out, err := put(t, fake, entry(`{}`), entry(`{}`), entry(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Entries) != 1 || len(fake.Received()) != 3 {
		t.Errorf("%d result entries, %d accepted; want 1 and 3", len(out.Entries), len(fake.Received()))
	}
}

func TestLatencyStallAndResume(t *testing.T) {
	fake := eventbridgefake.New(t)
	fake.SetLatency(50 * time.Millisecond)
	start := time.Now()
	if _, err := put(t, fake, entry(`{}`)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Errorf("a call with 50ms latency took %s", took)
	}
	fake.SetLatency(0)

	fake.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := eventbridge.NewFromConfig(fake.Config()).PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []types.PutEventsRequestEntry{entry(`{}`)}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("stalled call: %v, want the deadline", err)
	}

	fake.Resume()
	if _, err := put(t, fake, entry(`{}`)); err != nil {
		t.Errorf("after Resume: %v", err)
	}
	if n := len(fake.Received()); n != 2 {
		t.Errorf("%d accepted, want 2 (the stalled call accepts nothing)", n)
	}
}

// CallIDs lists every request's messages in request order, the calls in
// arrival order, whatever their fate.
func TestCallIDsListEveryRequest(t *testing.T) {
	fake := eventbridgefake.New(t)
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	detail := func(id uuid.UUID) types.PutEventsRequestEntry { return entry(fmt.Sprintf(`{"msg_id":%q}`, id)) }
	if _, err := put(t, fake, detail(a), detail(b)); err != nil {
		t.Fatal(err)
	}
	fake.FailCalls(1, 500, "InternalException")
	if _, err := put(t, fake, detail(c)); err == nil {
		t.Fatal("the failed call succeeded")
	}
	got := fake.CallIDs()
	if fmt.Sprint(got) != fmt.Sprint([][]uuid.UUID{{a, b}, {c}}) {
		t.Errorf("CallIDs %v, want [[%s %s] [%s]]", got, a, b, c)
	}
	if n := len(fake.ReceivedIDs()); n != 2 {
		t.Errorf("%d received, want the first call's 2", n)
	}
}

// A client without credentials sends its request unsigned; the fake
// refuses it, as EventBridge does, before reading it.
func TestRefusesUnsignedRequests(t *testing.T) {
	fake := eventbridgefake.New(t)
	cfg := fake.Config()
	cfg.Credentials = nil
	_, err := eventbridge.NewFromConfig(cfg).PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []types.PutEventsRequestEntry{entry(`{}`)}})
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "MissingAuthenticationTokenException" {
		t.Fatalf("error %v, want API error MissingAuthenticationTokenException", err)
	}
	var respErr *awshttp.ResponseError
	if !errors.As(err, &respErr) || respErr.HTTPStatusCode() != 403 {
		t.Errorf("error %v, want HTTP status 403", err)
	}
	if n := len(fake.Received()); n != 0 {
		t.Errorf("%d entries of an unsigned call accepted", n)
	}
}
