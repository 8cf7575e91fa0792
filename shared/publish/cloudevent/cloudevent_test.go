package cloudevent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// typical is a message as the dispatcher claims one: an ordered usage
// snapshot with a dedupe key, a tenant and a 300-byte payload.
func typical() *outboxtype.Message {
	return &outboxtype.Message{
		Keys: outboxtype.Keys{
			ID: uuid.MustParse("0193a4c2-7d1e-7b3a-9c4f-2e8d5a6b7c8d"), Namespace: "billing", Topic: "usage.recorded",
			TenantID: "tenant-42", DedupeKey: "usage-2026-11-28-0001", OrderingKey: "account-7", SequenceID: 1234,
		},
		Payload: json.RawMessage(`{"account": "account-7", "meter": "api_calls", "quantity": 1250, "unit": "request", ` +
			`"window": {"start": "2026-11-28T10:00:00Z", "end": "2026-11-28T10:05:00Z"}, "region": "eu-west-1", ` +
			`"plan": "enterprise", "labels": {"service": "search", "tier": "gold", "env": "production"}, "cost_micros": 987654}`),
		Attempt:   1,
		CreatedAt: time.Date(2026, 11, 28, 10, 5, 1, 123456000, time.UTC),
	}
}

func mustEncoder(t testing.TB, source string) *cloudevent.Encoder {
	t.Helper()
	e, err := cloudevent.New(source)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// readBinary sends headers and body through a real HTTP server and parses
// the request with the SDK, as a receiver would.
func readBinary(t testing.TB, h http.Header, body []byte) (*cloudevents.Event, http.Header) {
	t.Helper()
	var ev *cloudevents.Event
	var got http.Header
	var err error
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		ev, err = cehttp.NewEventFromHTTPRequest(r)
	}))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
	req.Header = h
	resp, rerr := srv.Client().Do(req)
	if rerr != nil {
		t.Fatal(rerr)
	}
	resp.Body.Close()
	if err != nil {
		t.Fatalf("the SDK cannot read the request: %v", err)
	}
	return ev, got
}

func TestStructuredReadsBackWithTheSDK(t *testing.T) {
	t.Parallel()
	unordered := typical()
	unordered.OrderingKey, unordered.SequenceID, unordered.TenantID, unordered.DedupeKey = "", 0, "", ""
	quoted := typical()
	quoted.DedupeKey, quoted.OrderingKey, quoted.TenantID = "key \"with\" quotes\\ and é", "ordre/été", "tenant\tone"
	array := typical()
	array.Payload = json.RawMessage(`[1, "two", {"three": null}]`)
	cases := map[string]struct {
		m      *outboxtype.Message
		source string
		want   string
	}{
		"typical":                 {typical(), "", "/outbox/billing"},
		"unordered, no dedupe":    {unordered, "", "/outbox/billing"},
		"strings to escape":       {quoted, "", "/outbox/billing"},
		"an array payload":        {array, "", "/outbox/billing"},
		"a source with the topic": {typical(), "https://example.com/events/{namespace}/{topic}", "https://example.com/events/billing/usage.recorded"},
		"a constant source":       {typical(), "urn:example:billing", "urn:example:billing"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			body, err := mustEncoder(t, tc.source).Structured(tc.m)
			if err != nil {
				t.Fatal(err)
			}
			publishtest.CheckCloudEvent(t, publishtest.ReadStructuredCloudEvent(t, body), tc.m, tc.want)
		})
	}
}

func TestBinaryReadsBackWithTheSDK(t *testing.T) {
	t.Parallel()
	unordered := typical()
	unordered.OrderingKey, unordered.SequenceID, unordered.TenantID, unordered.DedupeKey = "", 0, "", ""
	for name, m := range map[string]*outboxtype.Message{"typical": typical(), "unordered, no dedupe": unordered} {
		t.Run(name, func(t *testing.T) {
			h := http.Header{"Content-Type": {"application/json"}}
			if err := mustEncoder(t, "").SetBinaryHeaders(h, m); err != nil {
				t.Fatal(err)
			}
			ev, _ := readBinary(t, h, m.Payload)
			publishtest.CheckCloudEvent(t, ev, m, "/outbox/billing")
			if !bytes.Equal(ev.Data(), m.Payload) {
				t.Errorf("binary data %s, want the payload unchanged %s", ev.Data(), m.Payload)
			}
		})
	}
}

// A key, an ordering key or a tenant with a space, a quote, a percent sign
// or non-ASCII is percent-encoded, as the HTTP binding requires; decoding
// gives the value back.
func TestBinaryHeaderValuesArePercentEncoded(t *testing.T) {
	t.Parallel()
	m := typical()
	m.DedupeKey, m.OrderingKey, m.TenantID = `order 42 "été" 100%`, "clé", "plain-tenant"
	h := http.Header{"Content-Type": {"application/json"}}
	if err := mustEncoder(t, "").SetBinaryHeaders(h, m); err != nil {
		t.Fatal(err)
	}
	ev, got := readBinary(t, h, m.Payload)
	if want := "order%2042%20%22%C3%A9t%C3%A9%22%20100%25"; got.Get("Ce-Id") != want || ev.ID() != want {
		t.Errorf("ce-id %q (SDK %q), want %q", got.Get("Ce-Id"), ev.ID(), want)
	}
	for header, want := range map[string]string{"Ce-Id": m.DedupeKey, "Ce-Partitionkey": m.OrderingKey, "Ce-Tenantid": m.TenantID} {
		if v, err := url.PathUnescape(got.Get(header)); err != nil || v != want {
			t.Errorf("%s decodes to %q (%v), want %q", header, v, err, want)
		}
	}
}

// The sequence orders as a string, as the Sequence extension compares it.
func TestSequenceOrdersAsAString(t *testing.T) {
	t.Parallel()
	ids := []int64{1, 9, 10, 99, 100, 1 << 40, 1<<63 - 1}
	for i := 1; i < len(ids); i++ {
		if a, b := cloudevent.Sequence(ids[i-1]), cloudevent.Sequence(ids[i]); a >= b || len(a) != 19 {
			t.Errorf("Sequence(%d) = %q, not before Sequence(%d) = %q", ids[i-1], a, ids[i], b)
		}
	}
}

func TestSourceTemplates(t *testing.T) {
	t.Parallel()
	for template, problem := range map[string]string{
		"":                        "empty",
		"/outbox/{tenant}":        "unknown placeholder",
		"/outbox/{namespace":      "unknown placeholder",
		"/out box":                "character ' '",
		"/out%20box":              "character '%'",
		"/outbox/\u00e9":          "character 'é'",
		strings.Repeat("a", 1025): "over the limit of 1024",
	} {
		if err := cloudevent.CheckSource(template); err == nil || !strings.Contains(err.Error(), problem) {
			t.Errorf("CheckSource(%q) = %v, want an error saying %q", template, err, problem)
		}
	}
	for _, template := range []string{"/outbox/{namespace}", "urn:x:{namespace}:{topic}", "https://a.example/{topic}?v=1#f", "{namespace}"} {
		if err := cloudevent.CheckSource(template); err != nil {
			t.Errorf("CheckSource(%q) = %v", template, err)
		}
	}
}

// A payload that is not JSON, or a creation time RFC 3339 cannot write, is
// an error naming it, never a broken event.
func TestStructuredRefusesWhatItCannotEncode(t *testing.T) {
	t.Parallel()
	e := mustEncoder(t, "")
	for name, tc := range map[string]struct {
		change func(*outboxtype.Message)
		want   string
	}{
		"no payload":     {func(m *outboxtype.Message) { m.Payload = nil }, "no payload"},
		"not JSON":       {func(m *outboxtype.Message) { m.Payload = json.RawMessage(`{"a":`) }, "not JSON"},
		"year past 9999": {func(m *outboxtype.Message) { m.CreatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, "RFC 3339"},
	} {
		m := typical()
		tc.change(m)
		if _, err := e.Structured(m); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
		if name == "not JSON" {
			continue // binary mode sends the payload as it is
		}
		if err := e.Check(m); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Check says %v, want an error saying %q", name, err, tc.want)
		}
	}
}

// FuzzStructured holds that whatever the keys, topic and payload, the
// SDK reads the structured event back with every attribute and the payload,
// and reads the binary headers back to the same attributes.
func FuzzStructured(f *testing.F) {
	f.Add("usage-1", "usage.recorded", "tenant", "account-7", int64(12), `{"a": 1}`)
	f.Add("", "t", "", "", int64(0), `[1,2]`)
	f.Add("k\"\\\x01é\u2028", "t", "é", "<&>", int64(1<<62), `"string <&>\u2028"`)
	f.Add("k", "t", "\xff", "\xfe", int64(1), `{"a":"\u00e9 é \ud83d\ude00"}`)
	e, err := cloudevent.New("")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key, topic, tenant, orderingKey string, seq int64, payload string) {
		if !json.Valid([]byte(payload)) || seq < 0 {
			t.Skip()
		}
		m := typical()
		m.DedupeKey, m.Topic, m.TenantID, m.OrderingKey, m.SequenceID, m.Payload = key, topic, tenant, orderingKey, seq, json.RawMessage(payload)
		body, err := e.Structured(m)
		if strings.TrimSpace(m.StableKey()) == "" || strings.TrimSpace(topic) == "" {
			if err == nil {
				t.Fatalf("a blank id or type was encoded: %s", body)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var ev cloudevents.Event
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Fatalf("the SDK cannot read %s: %v", body, err)
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		// encoding/json replaces invalid UTF-8, so compare with its reading.
		valid := func(s string) string { var v string; b, _ := json.Marshal(s); _ = json.Unmarshal(b, &v); return v }
		ext := ev.Extensions()
		if ev.ID() != valid(m.StableKey()) || ev.Type() != valid(topic) || !ev.Time().Equal(m.CreatedAt) ||
			(orderingKey != "" && ext["partitionkey"] != valid(orderingKey)) || (tenant != "" && ext["tenantid"] != valid(tenant)) ||
			(seq != 0 && ext["sequence"] != cloudevent.Sequence(seq)) {
			t.Fatalf("read back %v from %s", ev, body)
		}
		if !publishtest.SameJSON(ev.Data(), m.Payload) {
			t.Fatalf("data %s, want %s", ev.Data(), m.Payload)
		}

		h := http.Header{}
		if err := e.SetBinaryHeaders(h, m); err != nil {
			t.Fatal(err)
		}
		for name, values := range h {
			for _, v := range values {
				for i := 0; i < len(v); i++ {
					if v[i] <= ' ' || v[i] >= 0x7f || v[i] == '"' {
						t.Fatalf("header %s = %q has the byte %q, which the HTTP binding escapes", name, v, v[i])
					}
				}
			}
		}
		if id, err := url.PathUnescape(h.Get(cloudevent.HeaderID)); err != nil || id != m.StableKey() {
			t.Fatalf("ce-id %q decodes to %q (%v), want %q", h.Get(cloudevent.HeaderID), id, err, m.StableKey())
		}
	})
}

// What the SDK's own encoding of the same event costs, against the
// package's: the figures in the package comment come from
//
//	go test -run '^$' -bench . -benchmem ./shared/publish/cloudevent/
func BenchmarkStructured(b *testing.B) {
	m := typical()
	b.Run("handwritten", func(b *testing.B) {
		e := mustEncoder(b, "")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.Structured(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sdk", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(sdkEvent(b, m)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkBinary(b *testing.B) {
	m := typical()
	b.Run("handwritten", func(b *testing.B) {
		e := mustEncoder(b, "")
		b.ReportAllocs()
		for b.Loop() {
			h := make(http.Header, 12)
			if err := e.SetBinaryHeaders(h, m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sdk", func(b *testing.B) {
		b.ReportAllocs()
		ctx := context.Background()
		for b.Loop() {
			ev := sdkEvent(b, m)
			req := &http.Request{Header: make(http.Header, 12)}
			if err := cehttp.WriteRequest(ctx, (*binding.EventMessage)(&ev), req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// sdkEvent builds the event with the SDK, as a dispatcher using it would.
func sdkEvent(b *testing.B, m *outboxtype.Message) cloudevents.Event {
	ev := cloudevents.New()
	ev.SetID(m.StableKey())
	ev.SetSource("/outbox/" + m.Namespace)
	ev.SetType(m.Topic)
	ev.SetTime(m.CreatedAt)
	ev.SetExtension("partitionkey", m.OrderingKey)
	ev.SetExtension("sequence", cloudevent.Sequence(m.SequenceID))
	ev.SetExtension("tenantid", m.TenantID)
	if err := ev.SetData("application/json", m.Payload); err != nil {
		b.Fatal(err)
	}
	return ev
}

// A structured event carries the message's W3C trace context as the
// Distributed Tracing extension's attributes, which the SDK reads back.
func TestStructuredCarriesTheTraceContext(t *testing.T) {
	t.Parallel()
	m := typical()
	m.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "rojo=1"}
	body, err := mustEncoder(t, "").Structured(m)
	if err != nil {
		t.Fatal(err)
	}
	ev := publishtest.ReadStructuredCloudEvent(t, body)
	publishtest.CheckCloudEvent(t, ev, m, "/outbox/"+m.Namespace)
	for name, want := range m.Headers {
		if got, _ := ev.Extensions()[name].(string); got != want {
			t.Errorf("extension %s = %q, want %q", name, got, want)
		}
	}
}
