package sns_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// With format cloudevents the body is the structured event, which the SDK
// reads back; the attributes are the same as without it; and the event
// counts against the topic's cap.
func TestCloudEventsStructuredBody(t *testing.T) {
	t.Parallel()
	events, err := cloudevent.New("urn:outbox:{namespace}:{topic}")
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, setupOptions{cfg: sns.Config{CloudEvents: events}})
	msgs := publishtest.OrderedMessages("account-7", 2, 300)
	unordered := publishtest.Message(2, 300)
	unordered.DedupeKey, unordered.TenantID = "", ""
	msgs = append(msgs, unordered)
	for i, r := range b.pub.Publish(context.Background(), msgs) {
		if r.Kind != publish.Delivered {
			t.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
		}
	}
	got := map[string]string{}
	for _, e := range b.fake.Received() {
		got[e.OutboxID.String()] = e.Message
		if want := expectedAttributes(msgsByID(msgs)[e.OutboxID.String()]); len(e.Attributes) != len(want) {
			t.Errorf("attributes %v, want %v", e.Attributes, want)
		}
	}
	for _, m := range msgs {
		ev := publishtest.ReadStructuredCloudEvent(t, []byte(got[m.ID.String()]))
		publishtest.CheckCloudEvent(t, ev, m, "urn:outbox:conformance:suite")
	}

	// The cap counts the event, not the payload alone.
	small := setup(t, setupOptions{cfg: sns.Config{CloudEvents: events, MaxMessageBytes: 600}})
	m := publishtest.Message(0, 400)
	r := small.pub.Publish(context.Background(), []*outboxtype.Message{m})[0]
	if r.Kind != publish.Terminal || r.Code != outboxtype.CodePayloadTooLarge {
		t.Errorf("a 400-byte payload whose event is over 600 bytes: %s %s %v", r.Kind, r.Code, r.Err)
	}
	m.DedupeKey = " "
	r = small.pub.Publish(context.Background(), []*outboxtype.Message{m})[0]
	if r.Kind != publish.Terminal || r.Code != outboxtype.CodeInvalidPayload || !strings.Contains(r.Err.Error(), "cannot be written as a CloudEvent") {
		t.Errorf("a blank dedupe key: %s %s %v", r.Kind, r.Code, r.Err)
	}
}

func msgsByID(msgs []*outboxtype.Message) map[string]*outboxtype.Message {
	out := map[string]*outboxtype.Message{}
	for _, m := range msgs {
		out[m.ID.String()] = m
	}
	return out
}
