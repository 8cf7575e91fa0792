package lambdainvoke

import (
	"testing"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// With format cloudevents the invocation's payload is the structured
// event, which the SDK reads back, and it counts against the cap.
func TestCloudEventsStructuredPayload(t *testing.T) {
	t.Parallel()
	events, err := cloudevent.New("")
	if err != nil {
		t.Fatal(err)
	}
	p, fake := newTestPublisher(t, ok(`{}`), func(c *Config) { c.CloudEvents = events })
	m := publishtest.Message(0, 300)
	m.OrderingKey, m.SequenceID = "account-7", 3
	if r := p.Publish(t.Context(), []*outboxtype.Message{m})[0]; r.Kind != publish.Delivered {
		t.Fatalf("%s %s %v", r.Kind, r.Code, r.Err)
	}
	inv := fake.Invocations()
	if len(inv) != 1 {
		t.Fatalf("%d invocations, want 1", len(inv))
	}
	publishtest.CheckCloudEvent(t, publishtest.ReadStructuredCloudEvent(t, inv[0].Payload), m, "/outbox/conformance")

	small, _ := newTestPublisher(t, ok(`{}`), func(c *Config) { c.CloudEvents, c.MaxPayloadBytes = events, 400 })
	r := small.Publish(t.Context(), []*outboxtype.Message{publishtest.Message(1, 300)})[0]
	if r.Kind != publish.Terminal || r.Code != outboxtype.CodePayloadTooLarge {
		t.Errorf("a 300-byte payload whose event is over 400 bytes: %s %s %v", r.Kind, r.Code, r.Err)
	}
}
