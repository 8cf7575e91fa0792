package eventbridge

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
)

// recordingClient answers every request with one answer, as EventBridge
// would, and keeps the last request it was sent.
type recordingClient struct {
	status int
	answer string
	sent   **http.Request
	body   *[]byte
}

func (c recordingClient) Do(r *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	*c.sent, *c.body = r, body
	h := http.Header{}
	h.Set("Content-Type", jsonContentType)
	h.Set("X-Amzn-RequestId", "b1d45f2c-0000-4000-8000-000000000000")
	return &http.Response{StatusCode: c.status, Header: h, Body: io.NopCloser(strings.NewReader(c.answer)), Request: r, ContentLength: int64(len(c.answer))}, nil
}

type call struct {
	request *http.Request
	body    []byte
	output  *eventbridge.PutEventsOutput
	err     error
}

// putEvents makes one PutEvents call through the SDK's client, with this
// package's codec or without, to a server that answers with status and
// answer.
func putEvents(t testing.TB, in *eventbridge.PutEventsInput, status int, answer string, ours bool) call {
	t.Helper()
	var c call
	cfg := aws.Config{
		Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		HTTPClient: recordingClient{status: status, answer: answer, sent: &c.request, body: &c.body},
		Retryer:    func() aws.Retryer { return aws.NopRetryer{} },
	}
	client := eventbridge.NewFromConfig(cfg)
	if ours {
		client = NewClient(cfg)
	}
	c.output, c.err = client.PutEvents(context.Background(), in)
	return c
}

const acceptedAnswer = `{"Entries":[{"EventId":"11111111-2222-3333-4444-555555555555"}],"FailedEntryCount":0}`

// sameRequest checks that the codec sends what the SDK sends for in: the
// same body byte for byte, the same method, URL and headers (but those
// that differ on every call: the time, the signature over it, the
// invocation id).
func sameRequest(t testing.TB, in *eventbridge.PutEventsInput) {
	t.Helper()
	sdk := putEvents(t, in, 200, acceptedAnswer, false)
	ours := putEvents(t, in, 200, acceptedAnswer, true)
	if (sdk.request == nil) != (ours.request == nil) {
		t.Fatalf("the SDK's client sent a request: %v; with the codec: %v (%v, %v)", sdk.request != nil, ours.request != nil, sdk.err, ours.err)
	}
	if sdk.request == nil {
		return
	}
	if !bytes.Equal(sdk.body, ours.body) {
		t.Fatalf("bodies differ:\nthe SDK's:  %q\nthe codec's: %q", sdk.body, ours.body)
	}
	if sdk.request.Method != ours.request.Method || sdk.request.URL.String() != ours.request.URL.String() {
		t.Fatalf("the SDK's request is %s %s; the codec's %s %s", sdk.request.Method, sdk.request.URL, ours.request.Method, ours.request.URL)
	}
	varying := map[string]bool{"Authorization": true, "X-Amz-Date": true, "Amz-Sdk-Invocation-Id": true}
	for _, h := range []http.Header{sdk.request.Header, ours.request.Header} {
		for name := range h {
			if !varying[name] && sdk.request.Header.Get(name) != ours.request.Header.Get(name) {
				t.Fatalf("header %s: the SDK's %q, the codec's %q", name, sdk.request.Header.Get(name), ours.request.Header.Get(name))
			}
		}
	}
	if sdk.request.ContentLength != ours.request.ContentLength {
		t.Fatalf("Content-Length: the SDK's %d, the codec's %d", sdk.request.ContentLength, ours.request.ContentLength)
	}
}

func entry(detail string) types.PutEventsRequestEntry {
	at := time.Date(2026, 11, 28, 13, 45, 7, 123_456_789, time.UTC)
	return types.PutEventsRequestEntry{
		Source: aws.String("outbox.billing"), DetailType: aws.String("usage"), Detail: aws.String(detail),
		EventBusName: aws.String("arn:aws:events:eu-west-1:123456789012:event-bus/billing"), Time: &at,
	}
}

func TestPutEventsRequestIsTheSDKs(t *testing.T) {
	full := entry(`{"a":1}`)
	full.Resources = []string{"arn:aws:s3:::bucket/x", `we"ird\`}
	full.TraceHeader = aws.String("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1")
	epoch := time.Unix(0, 0)
	cases := map[string]*eventbridge.PutEventsInput{
		"the publisher's entries": {Entries: []types.PutEventsRequestEntry{entry(`{"tenant_id":"tenant-42","tokens":1200}`), entry(`{"x":"y"}`)}},
		"every member":            {Entries: []types.PutEventsRequestEntry{full}, EndpointId: aws.String("abcde.veo")},
		"no members":              {Entries: []types.PutEventsRequestEntry{{}}},
		"empty entries":           {Entries: []types.PutEventsRequestEntry{}},
		"nil entries":             {},
		"empty resources":         {Entries: []types.PutEventsRequestEntry{{Resources: []string{}}}},
		"whole-second time":       {Entries: []types.PutEventsRequestEntry{{Time: &epoch}}},
		"escapes": {Entries: []types.PutEventsRequestEntry{entry(
			"{\"q\":\"\\\"quoted\\\"\",\"nl\":\"a\nb\",\"ctl\":\"\x00\x01\x1f\x7f\",\"tab\":\"\t\r\"}")}},
		"non-ASCII": {Entries: []types.PutEventsRequestEntry{entry(`{"name":"Zoë ✓ 𝄞","sep":"` + "\u2028\u2029" + `"}`)}},
		"invalid UTF-8": {Entries: []types.PutEventsRequestEntry{entry("{\"bad\":\"\xff\xfe\xc3\"}"),
			{Source: aws.String("\xe2\x80"), DetailType: aws.String("a\xed\xa0\x80b")}}},
		"html characters": {Entries: []types.PutEventsRequestEntry{entry(`{"h":"<a href='x'>&amp;</a>"}`)}},
		"a large detail":  {Entries: []types.PutEventsRequestEntry{entry(`{"pad":"` + strings.Repeat(`x\"`, 70_000) + `"}`)}},
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) { sameRequest(t, in) })
	}
}

// FuzzPutEventsRequestIsTheSDKs holds the codec's request to the SDK's for
// any strings in any field.
func FuzzPutEventsRequestIsTheSDKs(f *testing.F) {
	f.Add(`{"tenant_id":"t","tokens":1}`, "usage", "outbox.billing", "default", "", int64(1_764_337_507_123_456_789))
	f.Add("\x00\"\\\u2028\xff", "\t", "\u00e9", "a\nb", "Root=1-x", int64(-1))
	f.Add("", "", "", "", "", int64(0))
	f.Fuzz(func(t *testing.T, detail, detailType, source, bus, trace string, nanos int64) {
		at := time.Unix(0, nanos)
		e := types.PutEventsRequestEntry{Detail: &detail, DetailType: &detailType, Source: &source, EventBusName: &bus, Time: &at}
		if trace != "" {
			e.TraceHeader = &trace
			e.Resources = []string{trace, detail}
		}
		sameRequest(t, &eventbridge.PutEventsInput{Entries: []types.PutEventsRequestEntry{e, {Detail: &source}}})
	})
}

// TestJSONStringEscapesAsTheSDK covers every byte value and the runes the
// SDK's serializer treats apart, alone and between plain bytes.
func TestJSONStringEscapesAsTheSDK(t *testing.T) {
	var odd []string
	for b := 0; b < 256; b++ {
		odd = append(odd, string([]byte{byte(b)}), "ab"+string([]byte{byte(b)})+"cd")
	}
	odd = append(odd, "\u2028", "x\u2029y", string(utf8.RuneError), "\xed\xa0\x80", "\xf4\x90\x80\x80", "é\xc3")
	for i := 0; i < len(odd); i += 40 {
		var entries []types.PutEventsRequestEntry
		for _, s := range odd[i:min(i+40, len(odd))] {
			entries = append(entries, types.PutEventsRequestEntry{Detail: aws.String(s)})
		}
		sameRequest(t, &eventbridge.PutEventsInput{Entries: entries})
	}
}

// The codec writes the members PutEventsInput and PutEventsRequestEntry
// have today; a member an SDK upgrade adds would be left out of the body
// without a word, so the members are pinned here: a new one fails this
// test until appendPutEventsRequest writes it.
func TestTheCodecWritesEveryMemberOfTheSDKsInput(t *testing.T) {
	for _, c := range []struct {
		value any
		want  []string
	}{
		{eventbridge.PutEventsInput{}, []string{"Entries", "EndpointId"}},
		{types.PutEventsRequestEntry{}, []string{"Detail", "DetailType", "EventBusName", "Resources", "Source", "Time", "TraceHeader"}},
	} {
		var got []string
		typ := reflect.TypeOf(c.value)
		for i := range typ.NumField() {
			if f := typ.Field(i); f.IsExported() {
				got = append(got, f.Name)
			}
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s has the members %v; the codec writes %v", typ, got, c.want)
		}
	}
}
