// Package publishtest is the conformance suite every publisher passes: one
// result per message in order, oversize messages terminal without a call,
// partial failures kept apart, the context honoured, nothing dropped.
//
// A publisher's test wires it to a test double of its target (a wire-level
// fake server) and hands the suite a Target to drive:
//
//	func TestConformance(t *testing.T) {
//		publishtest.Run(t, func(t *testing.T) *publishtest.Target { ... })
//	}
//
// Every message the suite sends carries its id in its payload's "msg_id"
// field, so a double can tell messages apart whatever its wire format.
package publishtest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/publish"
)

// Target is a publisher under test, wired to a double the suite controls.
type Target struct {
	// Publisher publishes to the double.
	Publisher publish.Publisher
	// MaxPayloadBytes is the largest payload the publisher will send; the
	// suite sends one a byte over it and expects a terminal
	// PAYLOAD_TOO_LARGE without the double seeing it.
	MaxPayloadBytes int
	// Received returns the ids of the messages the double accepted so far.
	Received func() []uuid.UUID
	// Requests returns how many calls the double has received so far.
	Requests func() int
	// Fail makes the double refuse message id: with a retryable error, or a
	// terminal one.
	Fail func(id uuid.UUID, terminal bool)
	// Stall makes the double hold every later call until the caller gives up.
	Stall func()
}

// Run runs the suite; newTarget builds a fresh Target (and double) per case.
func Run(t *testing.T, newTarget func(t *testing.T) *Target) {
	t.Helper()
	t.Run("one result per message, in order", func(t *testing.T) {
		target := newTarget(t)
		msgs := Messages(23, 64)
		results := target.Publisher.Publish(context.Background(), msgs)
		checkLen(t, msgs, results)
		for i, r := range results {
			if r.Kind != publish.Delivered || r.TargetRef == "" {
				t.Errorf("message %d: %s %s %v (ref %q), want delivered with a target ref", i, r.Kind, r.Code, r.Err, r.TargetRef)
			}
		}
		checkReceived(t, target, ids(msgs))
	})

	t.Run("oversize message is terminal and never sent", func(t *testing.T) {
		target := newTarget(t)
		msgs := Messages(5, 64)
		msgs[2] = Message(2, target.MaxPayloadBytes+1)
		results := target.Publisher.Publish(context.Background(), msgs)
		checkLen(t, msgs, results)
		for i, r := range results {
			if i == 2 {
				if r.Kind != publish.Terminal || r.Code != publish.CodePayloadTooLarge {
					t.Errorf("oversize message: %s %s %v, want terminal PAYLOAD_TOO_LARGE", r.Kind, r.Code, r.Err)
				}
				continue
			}
			if r.Kind != publish.Delivered {
				t.Errorf("message %d: %s %s %v, want delivered", i, r.Kind, r.Code, r.Err)
			}
		}
		checkReceived(t, target, ids(slices.Delete(slices.Clone(msgs), 2, 3)))
	})

	t.Run("partial failures are kept apart", func(t *testing.T) {
		target := newTarget(t)
		msgs := Messages(10, 64)
		target.Fail(msgs[3].ID, false)
		target.Fail(msgs[7].ID, true)
		results := target.Publisher.Publish(context.Background(), msgs)
		checkLen(t, msgs, results)
		for i, r := range results {
			switch i {
			case 3:
				if r.Kind != publish.Retryable || r.Code == "" || r.Err == nil {
					t.Errorf("message 3: %s %q %v, want retryable with a code and an error", r.Kind, r.Code, r.Err)
				}
			case 7:
				if r.Kind != publish.Terminal || r.Code == "" || r.Err == nil {
					t.Errorf("message 7: %s %q %v, want terminal with a code and an error", r.Kind, r.Code, r.Err)
				}
			default:
				if r.Kind != publish.Delivered {
					t.Errorf("message %d: %s %s %v, want delivered", i, r.Kind, r.Code, r.Err)
				}
			}
		}
		var want []uuid.UUID
		for i, m := range msgs {
			if i != 3 && i != 7 {
				want = append(want, m.ID)
			}
		}
		checkReceived(t, target, want)
	})

	t.Run("a stalled target ends with the context, all retryable", func(t *testing.T) {
		target := newTarget(t)
		target.Stall()
		msgs := Messages(12, 64)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		results := target.Publisher.Publish(ctx, msgs)
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("Publish took %s after a 300ms context", took)
		}
		checkLen(t, msgs, results)
		for i, r := range results {
			if r.Kind != publish.Retryable || (r.Code != publish.CodeTimeout && r.Code != publish.CodeCanceled) {
				t.Errorf("message %d: %s %s %v, want retryable TIMEOUT or CANCELED", i, r.Kind, r.Code, r.Err)
			}
		}
	})

	t.Run("a context ended before the call sends nothing", func(t *testing.T) {
		target := newTarget(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		msgs := Messages(3, 64)
		results := target.Publisher.Publish(ctx, msgs)
		checkLen(t, msgs, results)
		for i, r := range results {
			if r.Kind != publish.Retryable {
				t.Errorf("message %d: %s %s %v, want retryable", i, r.Kind, r.Code, r.Err)
			}
		}
		if got := target.Received(); len(got) != 0 {
			t.Errorf("the double accepted %d messages under a canceled context", len(got))
		}
	})

	t.Run("an empty batch makes no call", func(t *testing.T) {
		target := newTarget(t)
		if results := target.Publisher.Publish(context.Background(), nil); len(results) != 0 {
			t.Errorf("%d results for no messages", len(results))
		}
		if n := target.Requests(); n != 0 {
			t.Errorf("%d calls for no messages", n)
		}
	})
}

// Messages builds n claimed messages with payloads of about payloadBytes.
func Messages(n, payloadBytes int) []*lease.Message {
	out := make([]*lease.Message, n)
	for i := range out {
		out[i] = Message(i, payloadBytes)
	}
	return out
}

// Message builds one claimed message whose payload is exactly payloadBytes
// long (or the smallest valid payload, if that is longer) and carries the
// message id as "msg_id".
func Message(i, payloadBytes int) *lease.Message {
	id := uuid.Must(uuid.NewV7())
	head := fmt.Sprintf(`{"msg_id":%q,"n":%d,"pad":"`, id, i)
	pad := max(payloadBytes-len(head)-2, 0)
	payload := head + strings.Repeat("x", pad) + `"}`
	return &lease.Message{
		ID: id, Namespace: "conformance", Topic: "suite", TenantID: "tenant-1",
		DedupeKey: "dedupe-" + id.String(), Payload: json.RawMessage(payload),
		Headers: map[string]string{"x-suite": "yes"}, Attempt: 1,
		LeaseToken: uuid.New(), LeaseExpiresAt: time.Now().Add(time.Minute), CreatedAt: time.Now(),
	}
}

// MessageID reads the "msg_id" the suite puts in every payload; doubles use
// it to tell messages apart.
func MessageID(payload []byte) (uuid.UUID, error) {
	var p struct {
		MsgID uuid.UUID `json:"msg_id"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		return uuid.Nil, err
	}
	return p.MsgID, nil
}

func ids(msgs []*lease.Message) []uuid.UUID {
	out := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func checkLen(t *testing.T, msgs []*lease.Message, results []publish.Result) {
	t.Helper()
	if len(results) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(results), len(msgs))
	}
}

func checkReceived(t *testing.T, target *Target, want []uuid.UUID) {
	t.Helper()
	got := target.Received()
	count := map[uuid.UUID]int{}
	for _, id := range got {
		count[id]++
	}
	for _, id := range want {
		if count[id] != 1 {
			t.Errorf("the double received message %s %d times, want once", id, count[id])
		}
		delete(count, id)
	}
	for id, n := range count {
		t.Errorf("the double received message %s (%d times), which should not have been sent", id, n)
	}
}
