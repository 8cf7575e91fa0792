package outbox

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestValidateRejectsEachBadField(t *testing.T) {
	t.Parallel()
	valid := func() Message {
		return Message{Namespace: "billing", Topic: "usage_snapshot", Payload: []byte(`{"tokens":12}`)}
	}
	cases := []struct {
		name   string
		mutate func(*Message)
		field  string
		reason string
	}{
		{"empty namespace", func(m *Message) { m.Namespace = "" }, "namespace", "must not be empty"},
		{"wildcard namespace", func(m *Message) { m.Namespace = "*" }, "namespace", "must be 1-128 characters"},
		{"namespace with space", func(m *Message) { m.Namespace = "bill ing" }, "namespace", "must be 1-128 characters"},
		{"namespace too long", func(m *Message) { m.Namespace = strings.Repeat("n", 129) }, "namespace", "must be 1-128 characters"},
		{"empty topic", func(m *Message) { m.Topic = "" }, "topic", "must not be empty"},
		{"empty payload", func(m *Message) { m.Payload = nil }, "payload", "must not be empty"},
		{"payload not JSON", func(m *Message) { m.Payload = []byte(`{"a":`) }, "payload", "not valid JSON"},
		{"payload a string", func(m *Message) { m.Payload = []byte(`"hello"`) }, "payload", "not a string"},
		{"payload a number", func(m *Message) { m.Payload = []byte(` 42`) }, "payload", "not a number"},
		{"payload null", func(m *Message) { m.Payload = []byte(`null`) }, "payload", "not a null"},
		{"payload over cap", func(m *Message) { m.Payload = []byte(`["` + strings.Repeat("x", 256*1024) + `"]`) }, "payload", "over the limit of 262144"},
		{"payload with NUL escape", func(m *Message) { m.Payload = []byte(`{"a":"\u0000"}`) }, "payload", `\u0000`},
		{"payload with lone surrogate", func(m *Message) { m.Payload = []byte(`{"a":"\udc00"}`) }, "payload", "low surrogate"},
		{"payload with unpaired high surrogate", func(m *Message) { m.Payload = []byte(`{"a":"\ud800x"}`) }, "payload", "high surrogate"},
		{"payload invalid UTF-8", func(m *Message) { m.Payload = []byte("{\"a\":\"\xff\"}") }, "payload", "UTF-8"},
		{"tenant too long", func(m *Message) { m.TenantID = strings.Repeat("t", 513) }, "tenant_id", "over the limit of 512"},
		{"dedupe key too long", func(m *Message) { m.DedupeKey = strings.Repeat("d", 513) }, "dedupe_key", "over the limit of 512"},
		{"ordering key with newline", func(m *Message) { m.OrderingKey = "a\nb" }, "ordering_key", "control character"},
		{"too many headers", func(m *Message) {
			m.Headers = map[string]string{}
			for i := range 17 {
				m.Headers[string(rune('a'+i))] = "v"
			}
		}, "headers", "more than the limit of 16"},
		{"header name with colon", func(m *Message) { m.Headers = map[string]string{"a:b": "v"} }, "headers", "name \"a:b\""},
		{"reserved header", func(m *Message) { m.Headers = map[string]string{"webhook-signature": "v"} }, "headers", "reserved"},
		{"authorization header", func(m *Message) { m.Headers = map[string]string{"Authorization": "Bearer forged-by-producer"} }, "headers", "reserved"},
		{"cookie header", func(m *Message) { m.Headers = map[string]string{"Cookie": "session=x"} }, "headers", "reserved"},
		{"x-forwarded-for header", func(m *Message) { m.Headers = map[string]string{"X-Forwarded-For": "10.0.0.1"} }, "headers", "reserved"},
		{"CloudEvents attribute header", func(m *Message) { m.Headers = map[string]string{"Ce-Type": "forged.by.producer"} }, "headers", "reserved"},
		{"method override header", func(m *Message) { m.Headers = map[string]string{"X-HTTP-Method-Override": "DELETE"} }, "headers", "reserved"},
		{"traceparent capitalised", func(m *Message) {
			m.Headers = map[string]string{"Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		}, "headers", `must be written "traceparent"`},
		{"traceparent malformed", func(m *Message) { m.Headers = map[string]string{"traceparent": "00-abc-01"} }, "headers", "not a version 00 traceparent"},
		{"tracestate alone", func(m *Message) { m.Headers = map[string]string{"tracestate": "rojo=1"} }, "headers", "without a traceparent"},
		{"header value with CRLF", func(m *Message) { m.Headers = map[string]string{"x-req": "a\r\nb"} }, "headers", "control character"},
		{"header value too long", func(m *Message) { m.Headers = map[string]string{"x-req": strings.Repeat("v", 1025)} }, "headers", "over the limit of 1024"},
		{"trace header with space", func(m *Message) { m.TraceHeader = "Root=1 2" }, "trace_header", "printable ASCII"},
		{"number too large for numeric", func(m *Message) { m.Payload = []byte(`{"a":1e1000000}`) }, "payload", "beyond what PostgreSQL's numeric"},
		{"number one digit past numeric", func(m *Message) { m.Payload = []byte(`[1e131072]`) }, "payload", "numeric"},
		{"fraction too long for numeric", func(m *Message) { m.Payload = []byte(`[0.1e-16383]`) }, "payload", "numeric"},
		{"number stored as 131,072 digits", func(m *Message) { m.Payload = []byte(`[1e131071]`) }, "payload", "beyond ±1e1000"},
		{"number stored as over a thousand digits", func(m *Message) { m.Payload = []byte(`[1e1000]`) }, "payload", "beyond ±1e1000"},
		{"number nearer to zero than 1e-1000", func(m *Message) { m.Payload = []byte(`[-1.5e-1001]`) }, "payload", "nearer to zero"},
		{"payload nested 10,001 deep", func(m *Message) {
			m.Payload = []byte(strings.Repeat("[", 10001) + strings.Repeat("]", 10001))
		}, "payload", "more than 10000 deep"},
		{"payload short, long as stored", func(m *Message) {
			m.Payload = []byte("[" + strings.Repeat("1e999,", 300) + "1]")
		}, "payload", "as stored, over the limit of 262144"},
		{"available_at beyond year 9999", func(m *Message) { m.AvailableAt = time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC) }, "available_at", "between the years 1 and 9999"},
		{"available_at far past pgx's range", func(m *Message) { m.AvailableAt = time.Unix(1<<62, 0) }, "available_at", "between the years"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := valid()
			tc.mutate(&m)
			err := DefaultLimits.validate(m, -1)
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("validate = %v, want a *ValidationError", err)
			}
			if !errors.Is(err, ErrInvalidMessage) {
				t.Errorf("errors.Is(err, ErrInvalidMessage) = false for %v", err)
			}
			if verr.Field != tc.field || !strings.Contains(verr.Reason, tc.reason) {
				t.Errorf("got field %q reason %q, want field %q reason containing %q", verr.Field, verr.Reason, tc.field, tc.reason)
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	t.Parallel()
	ok := []Message{
		{Namespace: "mini-chat", Topic: "usage_snapshot", Payload: []byte(`{"a":1}`)},
		{Namespace: "a", Topic: "b.c:d/e-f", Payload: []byte("  [1,2,3]")},
		{Namespace: "n", Topic: "t", Payload: []byte(`{"edge":[9.99e999, 1e-1000, -7, 0.5, "1e999999 in a string"]}`)},
		{Namespace: "n", Topic: "t", Payload: []byte(strings.Repeat("[", 10000) + strings.Repeat("]", 10000))},
		{Namespace: "n", Topic: "t", Payload: []byte(`{"emoji":"\ud83d\ude00","escaped":"\\u0000 is text here"}`),
			TenantID: "t-1", DedupeKey: "t-1/turn/req", OrderingKey: "user-42",
			Headers: map[string]string{"x-request-id": "abc", "Priority": "high"}, TraceHeader: "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"},
	}
	for i, m := range ok {
		if err := DefaultLimits.validate(m, i); err != nil {
			t.Errorf("message %d: %v", i, err)
		}
	}
}

func TestCustomPayloadCap(t *testing.T) {
	t.Parallel()
	p := Producer{Limits: Limits{MaxPayloadBytes: 10}}
	err := p.limits().validate(Message{Namespace: "n", Topic: "t", Payload: []byte(`{"a":"0123456789"}`)}, 2)
	if err == nil || !strings.Contains(err.Error(), "invalid message 2: payload is 19 bytes as stored, over the limit of 10") {
		t.Fatalf("err = %v", err)
	}
}
