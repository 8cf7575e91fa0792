package eventbridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
	"github.com/outboxkit/dispatcher/shared/publish/eventbridge"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// With format cloudevents Detail is the structured event, which the SDK
// reads back, Source and DetailType stay the route's; a payload that is no
// object, which Detail alone refuses, goes as the event's data.
func TestCloudEventsStructuredDetail(t *testing.T) {
	t.Parallel()
	events, err := cloudevent.New("")
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, eventbridge.Config{CloudEvents: events})
	msgs := publishtest.OrderedMessages("account-7", 2, 300)
	array := publishtest.Message(2, 64)
	array.Payload = json.RawMessage(`[1, 2, 3]`)
	msgs = append(msgs, array)
	for i, r := range b.publisher.Publish(context.Background(), msgs) {
		if r.Kind != publish.Delivered {
			t.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
		}
	}
	received := b.fake.Received()
	if len(received) != len(msgs) {
		t.Fatalf("%d entries, want %d", len(received), len(msgs))
	}
	for _, e := range received {
		ev := publishtest.ReadStructuredCloudEvent(t, []byte(e.Detail))
		var m *outboxtype.Message
		for _, c := range msgs {
			if c.StableKey() == ev.ID() {
				m = c
			}
		}
		if m == nil {
			t.Fatalf("an event of id %q was not sent", ev.ID())
		}
		publishtest.CheckCloudEvent(t, ev, m, "/outbox/conformance")
		if e.Source != "outbox.conformance" || e.DetailType != "suite" {
			t.Errorf("Source %q DetailType %q, want the route's outbox.conformance and suite", e.Source, e.DetailType)
		}
	}

	blank := publishtest.Message(0, 64)
	blank.DedupeKey = "\t"
	r := b.publisher.Publish(context.Background(), []*outboxtype.Message{blank})[0]
	if r.Kind != publish.Terminal || r.Code != outboxtype.CodeInvalidPayload || !errors.Is(r.Err, eventbridge.ErrNoCloudEvent) {
		t.Errorf("a blank dedupe key: %s %s %v", r.Kind, r.Code, r.Err)
	}
}
