package publishtest

import (
	"bytes"
	"encoding/json"
	"testing"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
)

// ReadStructuredCloudEvent reads a structured CloudEvent (the JSON event
// format) with the CloudEvents SDK's own parser, as a receiver would.
func ReadStructuredCloudEvent(t testing.TB, body []byte) *cloudevents.Event {
	t.Helper()
	var ev cloudevents.Event
	if err := json.Unmarshal(body, &ev); err != nil {
		t.Fatalf("the CloudEvents SDK cannot read %s: %v", body, err)
	}
	return &ev
}

// CheckCloudEvent asserts that an event the SDK read is m's under the
// cloudevents format: valid, id the stable key, the source given, type the
// topic, time the creation, the payload as JSON data, and the extensions
// partitionkey, sequence and tenantid exactly when m has them (and its
// traceparent and tracestate, where the event carries them).
func CheckCloudEvent(t testing.TB, ev *cloudevents.Event, m *outboxtype.Message, source string) {
	t.Helper()
	if err := ev.Validate(); err != nil {
		t.Errorf("the CloudEvents SDK finds the event invalid: %v", err)
	}
	if ev.SpecVersion() != "1.0" || ev.ID() != m.StableKey() || ev.Source() != source || ev.Type() != m.Topic {
		t.Errorf("specversion %q id %q source %q type %q, want 1.0, %q, %q, %q",
			ev.SpecVersion(), ev.ID(), ev.Source(), ev.Type(), m.StableKey(), source, m.Topic)
	}
	if !ev.Time().Equal(m.CreatedAt) {
		t.Errorf("time %s, want the creation %s", ev.Time(), m.CreatedAt)
	}
	if ev.DataContentType() != "application/json" {
		t.Errorf("datacontenttype %q, want application/json", ev.DataContentType())
	}
	if !SameJSON(ev.Data(), m.Payload) {
		t.Errorf("data %s, want the payload %s", ev.Data(), m.Payload)
	}
	want := map[string]string{}
	if m.OrderingKey != "" {
		want["partitionkey"] = m.OrderingKey
	}
	if m.SequenceID != 0 {
		want["sequence"] = cloudevent.Sequence(m.SequenceID)
	}
	if m.TenantID != "" {
		want["tenantid"] = m.TenantID
	}
	ext := ev.Extensions()
	// The Distributed Tracing attributes: a structured event carries the
	// message's trace context, a binary one has it as plain HTTP headers.
	for _, name := range []string{"traceparent", "tracestate"} {
		if _, ok := ext[name]; ok && m.Headers[name] != "" {
			want[name] = m.Headers[name]
		}
	}
	if len(ext) != len(want) {
		t.Errorf("extensions %v, want %v", ext, want)
	}
	for name, value := range want {
		if got, _ := ext[name].(string); got != value {
			t.Errorf("extension %s = %v, want %q", name, ext[name], value)
		}
	}
}

// SameJSON reports whether two JSON texts hold the same value.
func SameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}
