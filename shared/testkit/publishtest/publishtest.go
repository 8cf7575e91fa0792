// Package publishtest is the conformance suite every publisher passes: one
// result per message in order, oversize messages terminal without a call,
// partial failures kept apart, the context honoured, nothing dropped, and
// each ordering key's messages sent in sequence order, none after the key's
// first failure.
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
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
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
	// Received returns the ids of the messages the double accepted so far,
	// in the order it accepted them.
	Received func() []uuid.UUID
	// Calls returns the ids of the messages every call the double received
	// carried, whatever it answered: one slice per call, in request order,
	// the calls in the order they came (a call made after another was
	// answered comes after it).
	Calls func() [][]uuid.UUID
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
			if r.Latency <= 0 {
				t.Errorf("message %d: latency %s, want its call's duration", i, r.Latency)
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
				if r.Kind != publish.Terminal || r.Code != outboxtype.CodePayloadTooLarge {
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
			if r.Kind != publish.Retryable || (r.Code != outboxtype.CodeTimeout && r.Code != outboxtype.CodeCanceled) {
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

	t.Run("each key's messages arrive in sequence order", func(t *testing.T) {
		target := newTarget(t)
		a, b := OrderedMessages("key-a", 12, 64), OrderedMessages("key-b", 12, 64)
		msgs := shuffled(slices.Concat(a, b, Messages(6, 64)))
		results := target.Publisher.Publish(context.Background(), msgs)
		checkLen(t, msgs, results)
		for i, r := range results {
			if r.Kind != publish.Delivered || r.Latency <= 0 {
				t.Errorf("message %d (%s): %s %s %v, latency %s; want delivered", i, name(msgs[i]), r.Kind, r.Code, r.Err, r.Latency)
			}
		}
		checkReceived(t, target, ids(msgs))
		checkKeyOrder(t, target, msgs)
	})

	for _, terminal := range []bool{false, true} {
		kind := publish.Retryable
		if terminal {
			kind = publish.Terminal
		}
		t.Run(fmt.Sprintf("a %s failure stops its key, and only its key", kind), func(t *testing.T) {
			target := newTarget(t)
			a, b, unordered := OrderedMessages("key-a", 12, 64), OrderedMessages("key-b", 12, 64), Messages(6, 64)
			target.Fail(a[4].ID, terminal)
			msgs := shuffled(slices.Concat(a, b, unordered))
			results := target.Publisher.Publish(context.Background(), msgs)
			checkLen(t, msgs, results)
			byID := map[uuid.UUID]publish.Result{}
			for i, r := range results {
				byID[msgs[i].ID] = r
			}

			// The entries of a5's own call that come after it were sent
			// with it, legitimately: a target that accepted one of them
			// delivered it. Everything else after a5 stays unsent.
			calls := target.Calls()
			var withA5 []uuid.UUID
			for _, c := range calls {
				if i := slices.Index(c, a[4].ID); i >= 0 {
					withA5 = c[i+1:]
				}
			}
			received := map[uuid.UUID]bool{}
			for _, id := range target.Received() {
				received[id] = true
			}
			var want []uuid.UUID
			for i, m := range a {
				r := byID[m.ID]
				switch {
				case i < 4:
					if r.Kind != publish.Delivered {
						t.Errorf("%s: %s %s %v, want delivered", name(m), r.Kind, r.Code, r.Err)
					}
					want = append(want, m.ID)
				case i == 4:
					if r.Kind != kind || r.Code == "" || r.Err == nil {
						t.Errorf("%s: %s %q %v, want %s with a code and an error", name(m), r.Kind, r.Code, r.Err, kind)
					}
				case slices.Contains(withA5, m.ID) && received[m.ID]:
					if r.Kind != publish.Delivered {
						t.Errorf("%s: %s %s %v, accepted in a5's call; want delivered", name(m), r.Kind, r.Code, r.Err)
					}
					want = append(want, m.ID)
				default:
					if r.Kind != publish.Released || !errors.Is(r.Err, publish.ErrEarlierNotDelivered) || r.Latency != 0 {
						t.Errorf("%s: %s %s %v, latency %s; want released", name(m), r.Kind, r.Code, r.Err, r.Latency)
					}
					if n := sentIn(calls, m.ID); n > 0 && !slices.Contains(withA5, m.ID) {
						t.Errorf("%s: sent in %d calls after a5 failed", name(m), n)
					}
				}
			}
			for _, m := range slices.Concat(b, unordered) {
				if r := byID[m.ID]; r.Kind != publish.Delivered {
					t.Errorf("%s: %s %s %v, want delivered", name(m), r.Kind, r.Code, r.Err)
				}
				want = append(want, m.ID)
			}
			checkReceived(t, target, want)
			checkKeyOrder(t, target, msgs)
		})
	}

	t.Run("a context ended before the call: each key's first retryable, the rest released", func(t *testing.T) {
		target := newTarget(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		a, unordered := OrderedMessages("key-a", 3, 64), Messages(2, 64)
		msgs := slices.Concat(unordered, a)
		results := target.Publisher.Publish(ctx, msgs)
		checkLen(t, msgs, results)
		for i, r := range results {
			want := publish.Retryable
			if slices.Contains(a[1:], msgs[i]) {
				want = publish.Released
			}
			if r.Kind != want || r.Latency != 0 {
				t.Errorf("%s: %s %s %v, latency %s; want %s", name(msgs[i]), r.Kind, r.Code, r.Err, r.Latency, want)
			}
		}
		if n := target.Requests(); n != 0 {
			t.Errorf("%d calls under a canceled context", n)
		}
	})

	t.Run("a stalled target: each key's first retryable, the rest released", func(t *testing.T) {
		target := newTarget(t)
		target.Stall()
		a, unordered := OrderedMessages("key-a", 12, 64), Messages(3, 64)
		msgs := slices.Concat(a, unordered)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		results := target.Publisher.Publish(ctx, msgs)
		checkLen(t, msgs, results)
		for i, r := range results {
			switch {
			case slices.Contains(a[1:], msgs[i]):
				if r.Kind != publish.Released {
					t.Errorf("%s: %s %s %v, want released", name(msgs[i]), r.Kind, r.Code, r.Err)
				}
			case r.Kind != publish.Retryable || (r.Code != outboxtype.CodeTimeout && r.Code != outboxtype.CodeCanceled):
				t.Errorf("%s: %s %s %v, want retryable TIMEOUT or CANCELED", name(msgs[i]), r.Kind, r.Code, r.Err)
			}
		}
		// Only the key's first call went out: with its first message, the
		// later ones it carried (a batch target), and nothing after. One
		// look at the calls: the double records a stalled call only when
		// it sees the client give up, which may be after Publish returned,
		// so a second look can find the key's first call the first missed.
		calls := target.Calls()
		var first []uuid.UUID
		for _, c := range calls {
			if slices.Contains(c, a[0].ID) {
				first = c
				break
			}
		}
		for _, m := range a[1:] {
			if n := sentIn(calls, m.ID); n > 1 || (n == 1 && !slices.Contains(first, m.ID)) {
				t.Errorf("%s: sent after the key's first call stalled", name(m))
			}
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
func Messages(n, payloadBytes int) []*outboxtype.Message {
	out := make([]*outboxtype.Message, n)
	for i := range out {
		out[i] = Message(i, payloadBytes)
	}
	return out
}

// Message builds one claimed message whose payload is exactly payloadBytes
// long (or the smallest valid payload, if that is longer) and carries the
// message id as "msg_id".
func Message(i, payloadBytes int) *outboxtype.Message {
	id := uuid.Must(uuid.NewV7())
	head := fmt.Sprintf(`{"msg_id":%q,"n":%d,"pad":"`, id, i)
	pad := max(payloadBytes-len(head)-2, 0)
	payload := head + strings.Repeat("x", pad) + `"}`
	return &outboxtype.Message{
		Keys: outboxtype.Keys{
			ID: id, Namespace: "conformance", Topic: "suite", TenantID: "tenant-1", DedupeKey: "dedupe-" + id.String(),
		},
		Payload: json.RawMessage(payload), Headers: map[string]string{"x-suite": "yes"}, Attempt: 1,
		LeaseToken: uuid.New(), LeaseExpiresAt: time.Now().Add(time.Minute), CreatedAt: time.Now(),
	}
}

// OrderedMessages builds n messages of one ordering key, like Message,
// with sequence ids 10, 20, … in that order.
func OrderedMessages(key string, n, payloadBytes int) []*outboxtype.Message {
	out := Messages(n, payloadBytes)
	for i, m := range out {
		m.OrderingKey, m.SequenceID = key, int64(10*(i+1))
	}
	return out
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

// EnvelopeMessageID reads the "msg_id" of the payload inside an envelope
// (publish.Envelope): what plugin doubles receive.
func EnvelopeMessageID(envelope []byte) (uuid.UUID, error) {
	var env publish.Envelope
	if err := json.Unmarshal(envelope, &env); err != nil {
		return uuid.Nil, err
	}
	return MessageID(env.Payload)
}

// shuffled is msgs in an order that is not sequence order, the same on
// every run.
func shuffled(msgs []*outboxtype.Message) []*outboxtype.Message {
	out := slices.Clone(msgs)
	rand.New(rand.NewPCG(uint64(len(out)), 42)).Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// name is how failures name a message: its key and sequence id, or its
// payload's number.
func name(m *outboxtype.Message) string {
	if m.OrderingKey != "" {
		return fmt.Sprintf("%s#%d", m.OrderingKey, m.SequenceID)
	}
	return "unordered " + m.ID.String()
}

// sentIn is how many of calls carried id.
func sentIn(calls [][]uuid.UUID, id uuid.UUID) int {
	n := 0
	for _, c := range calls {
		if slices.Contains(c, id) {
			n++
		}
	}
	return n
}

// checkKeyOrder checks that the double was sent, and accepted, each key's
// messages in sequence order and none twice.
func checkKeyOrder(t *testing.T, target *Target, msgs []*outboxtype.Message) {
	t.Helper()
	byID := make(map[uuid.UUID]*outboxtype.Message, len(msgs))
	for _, m := range msgs {
		byID[m.ID] = m
	}
	check := func(what string, ids []uuid.UUID) {
		t.Helper()
		last := map[[2]string]int64{}
		for _, id := range ids {
			m := byID[id]
			if m == nil || m.OrderingKey == "" {
				continue
			}
			key := [2]string{m.Namespace, m.OrderingKey}
			if prev, ok := last[key]; ok && m.SequenceID <= prev {
				t.Errorf("the double %s %s after sequence id %d", what, name(m), prev)
			}
			last[key] = m.SequenceID
		}
	}
	check("was sent", slices.Concat(target.Calls()...))
	check("accepted", target.Received())
}

func ids(msgs []*outboxtype.Message) []uuid.UUID {
	out := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func checkLen(t *testing.T, msgs []*outboxtype.Message, results []publish.Result) {
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
