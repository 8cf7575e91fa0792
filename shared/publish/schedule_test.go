package publish_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
)

// fakeTarget is a Call that records what it is sent and answers as told.
// It checks, as the calls arrive, that no lane ever has two calls in
// flight.
type fakeTarget struct {
	// answer is one entry's result (default: delivered).
	answer func(m *outboxtype.Message) publish.Result
	// refuseWhole refuses a call of several entries as a whole, asking for
	// isolation, and a call of the entry alone terminally.
	refuseWhole func(m *outboxtype.Message) bool
	// before runs at the start of every call, outside the lock: to sleep,
	// cancel or panic.
	before func(ctx context.Context, msgs []*outboxtype.Message)

	mu          sync.Mutex
	calls       [][]*outboxtype.Message // in the order they started
	inFlight    map[string]int          // by lane
	current     int
	maxInFlight int
	overlaps    []string
}

func laneOf(m *outboxtype.Message) string {
	if m.OrderingKey == "" {
		return "unordered " + m.ID.String()
	}
	return m.Namespace + "/" + m.OrderingKey
}

func (f *fakeTarget) call(ctx context.Context, msgs []*outboxtype.Message, entries []*outboxtype.Message, results []publish.Result) bool {
	f.mu.Lock()
	if f.inFlight == nil {
		f.inFlight = map[string]int{}
	}
	f.calls = append(f.calls, slices.Clone(msgs))
	f.current++
	f.maxInFlight = max(f.maxInFlight, f.current)
	var lanes []string
	for j, m := range msgs {
		if entries[j] != m {
			f.overlaps = append(f.overlaps, "an entry is not its message's")
		}
		if l := laneOf(m); !slices.Contains(lanes, l) {
			lanes = append(lanes, l)
			if f.inFlight[l]++; f.inFlight[l] > 1 {
				f.overlaps = append(f.overlaps, "two calls in flight for lane "+l)
			}
		}
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.current--
		for _, l := range lanes {
			f.inFlight[l]--
		}
		f.mu.Unlock()
	}()

	if f.before != nil {
		f.before(ctx, msgs)
	}
	if f.refuseWhole != nil && slices.ContainsFunc(msgs, f.refuseWhole) {
		r := publish.Fail(outboxtype.CodeInvalidPayload, errors.New("the request is invalid"))
		for j := range results {
			results[j] = r
		}
		return true
	}
	for j, m := range msgs {
		if f.answer != nil {
			results[j] = f.answer(m)
		} else {
			results[j] = publish.Ok("ref-" + m.ID.String())
		}
	}
	return false
}

// callSizes is the number of entries of each call, in the order the calls
// started.
func (f *fakeTarget) callSizes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	sizes := make([]int, len(f.calls))
	for i, c := range f.calls {
		sizes[i] = len(c)
	}
	return sizes
}

func (f *fakeTarget) sentCalls() [][]*outboxtype.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeTarget) sentCount(m *outboxtype.Message) int {
	n := 0
	for _, c := range f.sentCalls() {
		for _, s := range c {
			if s == m {
				n++
			}
		}
	}
	return n
}

func (f *fakeTarget) checkNoOverlap(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range f.overlaps {
		t.Error(o)
	}
}

// batcher is a Batcher of f whose entries are the messages themselves,
// sized by their payload.
func batcher(f *fakeTarget, maxEntries, concurrency int) publish.Batcher[*outboxtype.Message] {
	return publish.Batcher[*outboxtype.Message]{
		MaxEntries:  maxEntries,
		Concurrency: concurrency,
		Prepare: func(m *outboxtype.Message) (*outboxtype.Message, int, *publish.Result) {
			return m, len(m.Payload), nil
		},
		Call: f.call,
	}
}

func message(key string, seq int64) *outboxtype.Message {
	return &outboxtype.Message{Keys: outboxtype.Keys{ID: uuid.New(), Namespace: "ns", OrderingKey: key, SequenceID: seq}, Payload: []byte(`{}`), Attempt: 1}
}

// keyMessages is n messages of one key, sequence ids 1 to n.
func keyMessages(key string, n int) []*outboxtype.Message {
	out := make([]*outboxtype.Message, n)
	for i := range out {
		out[i] = message(key, int64(i+1))
	}
	return out
}

func unordered(n int) []*outboxtype.Message { return keyMessages("", n) }

func concat(parts ...[]*outboxtype.Message) []*outboxtype.Message { return slices.Concat(parts...) }

// resultsOf maps each message to its result.
func resultsOf(t *testing.T, msgs []*outboxtype.Message, results []publish.Result) map[*outboxtype.Message]publish.Result {
	t.Helper()
	if len(results) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(results), len(msgs))
	}
	out := make(map[*outboxtype.Message]publish.Result, len(msgs))
	for i, m := range msgs {
		out[m] = results[i]
	}
	return out
}

func describe(r publish.Result) string {
	return fmt.Sprintf("%s %s %v", r.Kind, r.Code, r.Err)
}

func TestBatcherPacksReadyLanesIntoFullCalls(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		msgs        func() []*outboxtype.Message
		maxEntries  int
		maxBytes    int
		concurrency int
		sizes       []int // per call, sorted
		maxInFlight int   // 0: not checked
	}{
		{"500 unordered go 10 a call", func() []*outboxtype.Message { return unordered(500) }, 10, 0, 8, slices.Repeat([]int{10}, 50), 0},
		{"3 keys of 3 go as one call of 9", func() []*outboxtype.Message {
			return concat(keyMessages("a", 3), keyMessages("b", 3), keyMessages("c", 3))
		}, 10, 0, 8, []int{9}, 1},
		{"one key of 100 goes as 10 calls of 10, one at a time", func() []*outboxtype.Message { return keyMessages("hot", 100) }, 10, 0, 8, slices.Repeat([]int{10}, 10), 1},
		{"a key of 15 beside 5 unordered", func() []*outboxtype.Message { return concat(keyMessages("a", 15), unordered(5)) }, 10, 0, 8, []int{5, 5, 10}, 0},
		{"one entry a call: 3 keys of 4 side by side", func() []*outboxtype.Message {
			return concat(keyMessages("a", 4), keyMessages("b", 4), keyMessages("c", 4))
		}, 1, 0, 8, slices.Repeat([]int{1}, 12), 3},
		{"the byte cap: two of 40 bytes within 100", func() []*outboxtype.Message {
			msgs := unordered(7)
			for _, m := range msgs {
				m.Payload = []byte(`{"pad":"` + strings.Repeat("x", 40-10) + `"}`)
			}
			return msgs
		}, 10, 100, 1, []int{1, 2, 2, 2}, 1},
		{"an entry over the byte cap goes alone", func() []*outboxtype.Message {
			msgs := unordered(3)
			msgs[1].Payload = []byte(`{"pad":"` + strings.Repeat("x", 200) + `"}`)
			return msgs
		}, 10, 100, 1, []int{1, 1, 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeTarget{before: func(context.Context, []*outboxtype.Message) { time.Sleep(5 * time.Millisecond) }}
			b := batcher(f, tc.maxEntries, tc.concurrency)
			b.MaxBytes = tc.maxBytes
			msgs := tc.msgs()
			for m, r := range resultsOf(t, msgs, b.Publish(context.Background(), msgs)) {
				if r.Kind != publish.Delivered || f.sentCount(m) != 1 {
					t.Fatalf("message %s: %s, sent %d times; want delivered, sent once", m.ID, describe(r), f.sentCount(m))
				}
			}
			sizes := f.callSizes()
			slices.Sort(sizes)
			if !slices.Equal(sizes, tc.sizes) {
				t.Errorf("calls of %v entries, want %v", sizes, tc.sizes)
			}
			if tc.maxInFlight > 0 && f.maxInFlight != tc.maxInFlight {
				t.Errorf("%d calls in flight at most, want %d", f.maxInFlight, tc.maxInFlight)
			}
			f.checkNoOverlap(t)
		})
	}
}

// A lane's messages go in sequence order whatever their order in msgs.
func TestBatcherSendsALaneInSequenceOrder(t *testing.T) {
	t.Parallel()
	f := &fakeTarget{}
	msgs := concat(keyMessages("key", 25), unordered(5))
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })

	for m, r := range resultsOf(t, msgs, batcher(f, 10, 4).Publish(context.Background(), msgs)) {
		if r.Kind != publish.Delivered {
			t.Errorf("message %q %d: %s", m.OrderingKey, m.SequenceID, describe(r))
		}
	}
	var sent []int64
	for _, c := range f.sentCalls() {
		for _, m := range c {
			if m.OrderingKey == "key" {
				sent = append(sent, m.SequenceID)
			}
		}
	}
	if !slices.IsSorted(sent) || len(sent) != 25 {
		t.Errorf("the key's messages went out as %v, want 1 to 25 in order", sent)
	}
	f.checkNoOverlap(t)
}

// A lane is a namespace's ordering key: the same key in another namespace
// is another lane, which a failure does not stop.
func TestBatcherLaneIsNamespaceAndKey(t *testing.T) {
	t.Parallel()
	ours, theirs := keyMessages("key", 3), keyMessages("key", 3)
	for _, m := range theirs {
		m.Namespace = "other"
	}
	f := &fakeTarget{answer: func(m *outboxtype.Message) publish.Result {
		if m == ours[0] {
			return publish.Retry(outboxtype.CodeTarget5xx, errors.New("later"), 0)
		}
		return publish.Ok("ref")
	}}
	msgs := concat(ours, theirs)
	byMsg := resultsOf(t, msgs, batcher(f, 1, 4).Publish(context.Background(), msgs))
	for i, want := range []publish.Kind{publish.Retryable, publish.Released, publish.Released} {
		if r := byMsg[ours[i]]; r.Kind != want {
			t.Errorf("ns message %d: %s, want %s", i+1, describe(r), want)
		}
	}
	for i, m := range theirs {
		if r := byMsg[m]; r.Kind != publish.Delivered {
			t.Errorf("other message %d: %s, want delivered", i+1, describe(r))
		}
	}
}

func TestBatcherStopsALaneAtItsFirstFailure(t *testing.T) {
	t.Parallel()
	for _, terminal := range []bool{false, true} {
		for _, maxEntries := range []int{1, 10} {
			t.Run(fmt.Sprintf("terminal=%t/maxEntries=%d", terminal, maxEntries), func(t *testing.T) {
				t.Parallel()
				a, b, u := keyMessages("a", 12), keyMessages("b", 12), unordered(6)
				failure := publish.Retry(outboxtype.CodeTarget5xx, errors.New("try later"), 0)
				if terminal {
					failure = publish.Fail(outboxtype.CodeTargetRejected, errors.New("never"))
				}
				f := &fakeTarget{answer: func(m *outboxtype.Message) publish.Result {
					if m == a[4] || m == u[2] {
						return failure
					}
					return publish.Ok("ref")
				}}
				// The key fails at a[4], its 5th message; a[5:] must not
				// be sent in a call after that one.
				msgs := concat(a, u, b)
				byMsg := resultsOf(t, msgs, batcher(f, maxEntries, 4).Publish(context.Background(), msgs))

				failedCall := -1
				for i, c := range f.sentCalls() {
					if slices.Contains(c, a[4]) {
						failedCall = i
					}
				}
				for i, m := range a {
					r := byMsg[m]
					switch {
					case i < 4:
						if r.Kind != publish.Delivered {
							t.Errorf("a%d: %s, want delivered", i+1, describe(r))
						}
					case i == 4:
						if r.Kind != failure.Kind || r.Code != failure.Code {
							t.Errorf("a5: %s, want %s", describe(r), describe(failure))
						}
					default:
						inFailedCall := slices.Contains(f.sentCalls()[failedCall], m)
						// Delivered in the failed call: the target
						// accepted it, so it stays so.
						if inFailedCall && r.Kind != publish.Delivered {
							t.Errorf("a%d: %s, want delivered (the target accepted it in a5's call)", i+1, describe(r))
						}
						if !inFailedCall && (r.Kind != publish.Released || !errors.Is(r.Err, publish.ErrEarlierNotDelivered) || r.Latency != 0 || f.sentCount(m) != 0) {
							t.Errorf("a%d: %s, latency %s, sent %d times; want released, never sent", i+1, describe(r), r.Latency, f.sentCount(m))
						}
					}
				}
				if maxEntries == 1 && failedCall < 0 {
					t.Fatal("a5 never sent")
				}
				for i, m := range b {
					if r := byMsg[m]; r.Kind != publish.Delivered {
						t.Errorf("b%d: %s, want delivered", i+1, describe(r))
					}
				}
				for i, m := range u {
					want := publish.Delivered
					if i == 2 {
						want = failure.Kind // and no more: it has no lane to stop
					}
					if r := byMsg[m]; r.Kind != want {
						t.Errorf("unordered %d: %s, want %s", i, describe(r), want)
					}
				}
				f.checkNoOverlap(t)
			})
		}
	}
}

// A call that fails an entry of a lane and accepts a later one: the later
// one was delivered and stays so; a later one it also failed is released;
// and nothing of the lane goes in a later call.
func TestBatcherKeepsADeliveryAfterAFailureInOneCall(t *testing.T) {
	t.Parallel()
	a := keyMessages("a", 12)
	f := &fakeTarget{answer: func(m *outboxtype.Message) publish.Result {
		switch m {
		case a[4]:
			return publish.Retry(outboxtype.CodeTarget5xx, errors.New("later"), 0)
		case a[6]:
			return publish.Fail(outboxtype.CodeTargetRejected, errors.New("never"))
		}
		return publish.Ok("ref")
	}}
	byMsg := resultsOf(t, a, batcher(f, 10, 4).Publish(context.Background(), a))
	want := []publish.Kind{
		publish.Delivered, publish.Delivered, publish.Delivered, publish.Delivered,
		publish.Retryable, publish.Delivered, publish.Released, publish.Delivered, publish.Delivered, publish.Delivered,
		publish.Released, publish.Released,
	}
	for i, m := range a {
		if r := byMsg[m]; r.Kind != want[i] {
			t.Errorf("a%d: %s, want %s", i+1, describe(r), want[i])
		}
	}
	if got := f.callSizes(); !slices.Equal(got, []int{10}) {
		t.Errorf("calls of %v entries, want one of 10", got)
	}
}

// A message Prepare refuses ends its lane when its turn comes: after its
// lane's earlier messages are delivered it keeps its refusal; if one of
// them fails, it is released like the rest.
func TestBatcherRefusalInALaneWaitsForTheMessagesBeforeIt(t *testing.T) {
	t.Parallel()
	for _, earlierFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("earlier fails=%t", earlierFails), func(t *testing.T) {
			t.Parallel()
			a := keyMessages("a", 5)
			f := &fakeTarget{answer: func(m *outboxtype.Message) publish.Result {
				if earlierFails && m == a[0] {
					return publish.Retry(outboxtype.CodeTarget5xx, errors.New("later"), 0)
				}
				return publish.Ok("ref")
			}}
			b := batcher(f, 10, 4)
			refusal := publish.Fail(outboxtype.CodePayloadTooLarge, errors.New("too large"))
			b.Prepare = func(m *outboxtype.Message) (*outboxtype.Message, int, *publish.Result) {
				if m == a[2] {
					return nil, 0, &refusal
				}
				return m, 1, nil
			}
			byMsg := resultsOf(t, a, b.Publish(context.Background(), a))
			want := []publish.Kind{publish.Delivered, publish.Delivered, publish.Terminal, publish.Released, publish.Released}
			if earlierFails {
				want = []publish.Kind{publish.Retryable, publish.Delivered, publish.Released, publish.Released, publish.Released}
			}
			for i, m := range a {
				if r := byMsg[m]; r.Kind != want[i] {
					t.Errorf("a%d: %s, want %s", i+1, describe(r), want[i])
				}
			}
			if got := f.callSizes(); !slices.Equal(got, []int{2}) {
				t.Errorf("calls of %v entries, want one of the 2 messages before the refused one", got)
			}
		})
	}
}

func TestBatcherContextEndedBeforehandSendsNothing(t *testing.T) {
	t.Parallel()
	f := &fakeTarget{}
	a, u := keyMessages("a", 3), unordered(2)
	msgs := concat(u, a)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	byMsg := resultsOf(t, msgs, batcher(f, 10, 4).Publish(ctx, msgs))
	for _, m := range []*outboxtype.Message{u[0], u[1], a[0]} {
		if r := byMsg[m]; r.Kind != publish.Retryable || r.Code != outboxtype.CodeCanceled || r.Latency != 0 {
			t.Errorf("message %d of %q: %s, latency %s; want retryable CANCELED without latency", m.SequenceID, m.OrderingKey, describe(r), r.Latency)
		}
	}
	for _, m := range a[1:] {
		if r := byMsg[m]; r.Kind != publish.Released {
			t.Errorf("a%d: %s, want released", m.SequenceID, describe(r))
		}
	}
	if n := len(f.sentCalls()); n != 0 {
		t.Errorf("%d calls under an ended context", n)
	}
}

// When ctx ends midway, nothing is sent after; each lane comes back as
// delivered messages, then one retryable (the call in flight, or the first
// message not sent), then released ones; an unordered message is delivered
// or retryable.
func TestBatcherContextEndingMidway(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls int
	var mu sync.Mutex
	f := &fakeTarget{before: func(ctx context.Context, msgs []*outboxtype.Message) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 6 {
			cancel()
		}
		time.Sleep(2 * time.Millisecond)
	}}
	f.answer = func(m *outboxtype.Message) publish.Result {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil {
			r, _ := publish.ContextResult(ctx, ctx.Err())
			return r
		}
		return publish.Ok("ref")
	}
	a, b, u := keyMessages("a", 8), keyMessages("b", 8), unordered(8)
	msgs := concat(a, b, u)
	byMsg := resultsOf(t, msgs, batcher(f, 1, 3).Publish(ctx, msgs))

	if n := len(f.sentCalls()); n > 6+2 {
		t.Errorf("%d calls: calls started after the context ended", n)
	}
	for _, l := range [][]*outboxtype.Message{a, b} {
		state := publish.Delivered
		for _, m := range l {
			r := byMsg[m]
			switch {
			case r.Kind == state:
			case state == publish.Delivered && r.Kind == publish.Retryable && r.Code == outboxtype.CodeCanceled:
				state = publish.Released
			default:
				t.Errorf("%s%d: %s after %s messages", m.OrderingKey, m.SequenceID, describe(r), state)
			}
			if r.Kind == publish.Released && f.sentCount(m) != 0 {
				t.Errorf("%s%d: released, but it was sent", m.OrderingKey, m.SequenceID)
			}
		}
	}
	for i, m := range u {
		if r := byMsg[m]; r.Kind != publish.Delivered && (r.Kind != publish.Retryable || r.Code != outboxtype.CodeCanceled) {
			t.Errorf("unordered %d: %s, want delivered or retryable CANCELED", i, describe(r))
		}
	}
}

// A call in flight when the context ends answers its lane's first entry as
// the context says, and the lane's other entries, in that call and after
// it, come back released.
func TestBatcherCallCutOffByTheContext(t *testing.T) {
	t.Parallel()
	f := &fakeTarget{before: func(ctx context.Context, _ []*outboxtype.Message) { <-ctx.Done() }}
	f.answer = func(*outboxtype.Message) publish.Result {
		return publish.Retry(outboxtype.CodeTimeout, context.DeadlineExceeded, 0)
	}
	a, u := keyMessages("a", 12), unordered(3)
	msgs := concat(a, u)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	byMsg := resultsOf(t, msgs, batcher(f, 10, 4).Publish(ctx, msgs))
	if r := byMsg[a[0]]; r.Kind != publish.Retryable || r.Code != outboxtype.CodeTimeout || r.Latency < 40*time.Millisecond {
		t.Errorf("a1: %s, latency %s; want retryable TIMEOUT after the call's wait", describe(r), r.Latency)
	}
	for _, m := range a[1:] {
		if r := byMsg[m]; r.Kind != publish.Released || r.Latency != 0 {
			t.Errorf("a%d: %s, latency %s; want released", m.SequenceID, describe(r), r.Latency)
		}
	}
	for i, m := range u {
		if r := byMsg[m]; r.Kind != publish.Retryable {
			t.Errorf("unordered %d: %s, want retryable", i, describe(r))
		}
	}
}

// A panic in one call costs that call's messages (and their lanes), not the
// process; one in Prepare costs that message alone.
func TestBatcherContainsPanics(t *testing.T) {
	t.Parallel()
	a, b, u := keyMessages("a", 3), keyMessages("b", 3), unordered(3)
	f := &fakeTarget{before: func(_ context.Context, msgs []*outboxtype.Message) {
		if slices.Contains(msgs, a[1]) {
			panic("a bug")
		}
	}}
	bt := batcher(f, 1, 4)
	bt.Prepare = func(m *outboxtype.Message) (*outboxtype.Message, int, *publish.Result) {
		return m, len(m.Payload), nil // a nil message panics here
	}
	msgs := concat(a, b, u, []*outboxtype.Message{nil})
	results := bt.Publish(context.Background(), msgs)
	byMsg := resultsOf(t, msgs, results)
	want := map[*outboxtype.Message]publish.Kind{a[0]: publish.Delivered, a[1]: publish.Retryable, a[2]: publish.Released}
	for _, m := range concat(b, u) {
		want[m] = publish.Delivered
	}
	for m, kind := range want {
		if r := byMsg[m]; r.Kind != kind {
			t.Errorf("%q %d: %s, want %s", m.OrderingKey, m.SequenceID, describe(r), kind)
		}
	}
	for _, r := range []publish.Result{byMsg[a[1]], results[len(results)-1]} {
		if r.Kind != publish.Retryable || r.Code != outboxtype.CodeTarget5xx || !strings.Contains(fmt.Sprint(r.Err), "panic") {
			t.Errorf("%s, want retryable TARGET_5XX naming the panic", describe(r))
		}
	}
}

func TestBatcherHoldsConcurrency(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		msgs        []*outboxtype.Message
		concurrency int
		want        int
	}{
		{"more messages than workers", unordered(40), 5, 5},
		{"no more calls than lanes", concat(keyMessages("a", 10), keyMessages("b", 10), keyMessages("c", 10)), 8, 3},
		{"one at a time", unordered(10), 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeTarget{before: func(context.Context, []*outboxtype.Message) { time.Sleep(10 * time.Millisecond) }}
			for m, r := range resultsOf(t, tc.msgs, batcher(f, 1, tc.concurrency).Publish(context.Background(), tc.msgs)) {
				if r.Kind != publish.Delivered {
					t.Fatalf("message %s: %s", m.ID, describe(r))
				}
			}
			if f.maxInFlight != tc.want {
				t.Errorf("%d calls in flight at most, want %d", f.maxInFlight, tc.want)
			}
			f.checkNoOverlap(t)
		})
	}
}

// Each message's latency is its own call's, not the slowest call's.
func TestBatcherLatencyIsPerCall(t *testing.T) {
	t.Parallel()
	msgs := unordered(6)
	sleeps := map[*outboxtype.Message]time.Duration{msgs[0]: 20 * time.Millisecond, msgs[2]: 150 * time.Millisecond, msgs[4]: 400 * time.Millisecond}
	f := &fakeTarget{before: func(_ context.Context, call []*outboxtype.Message) { time.Sleep(sleeps[call[0]]) }}
	// Two entries a call: {0,1} {2,3} {4,5}, all three at once.
	byMsg := resultsOf(t, msgs, batcher(f, 2, 3).Publish(context.Background(), msgs))
	for i, m := range msgs {
		own := sleeps[msgs[i&^1]]
		if r := byMsg[m]; r.Kind != publish.Delivered || r.Latency < own || r.Latency > own+100*time.Millisecond {
			t.Errorf("message %d: %s, latency %s; want delivered with its call's %s", i, describe(r), r.Latency, own)
		}
	}
	if got := f.callSizes(); !slices.Equal(got, []int{2, 2, 2}) {
		t.Errorf("calls of %v entries, want three of 2", got)
	}
}

// Isolating a bad entry re-sends the call's entries in parts, in order;
// each result's latency is its own re-send's; and the bad entry's lane has
// its later entries released instead of sent.
func TestBatcherIsolatesABadEntryKeepingOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		isolation publish.Isolation
		calls     []string
	}{
		{"in halves", publish.IsolateInHalves, []string{"a1 a2 a3 a4 u1 u2", "a1 a2 a3", "a1", "a2 a3", "a2", "u1 u2"}},
		{"one by one", publish.IsolateOneByOne, []string{"a1 a2 a3 a4 u1 u2", "a1", "a2", "u1", "u2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, u := keyMessages("a", 4), unordered(2)
			names := map[*outboxtype.Message]string{u[0]: "u1", u[1]: "u2"}
			for i, m := range a {
				names[m] = fmt.Sprintf("a%d", i+1)
			}
			f := &fakeTarget{
				refuseWhole: func(m *outboxtype.Message) bool { return m == a[1] },
				before: func(_ context.Context, msgs []*outboxtype.Message) {
					if len(msgs) > 1 {
						time.Sleep(100 * time.Millisecond)
					}
				},
			}
			b := batcher(f, 10, 4)
			b.Isolation = tc.isolation
			msgs := concat(a, u)
			byMsg := resultsOf(t, msgs, b.Publish(context.Background(), msgs))

			var calls []string
			for _, c := range f.sentCalls() {
				var ids []string
				for _, m := range c {
					ids = append(ids, names[m])
				}
				calls = append(calls, strings.Join(ids, " "))
			}
			if !slices.Equal(calls, tc.calls) {
				t.Errorf("calls\n%q\nwant\n%q", calls, tc.calls)
			}
			want := map[*outboxtype.Message]publish.Kind{a[0]: publish.Delivered, a[1]: publish.Terminal, a[2]: publish.Released, a[3]: publish.Released}
			for m, kind := range want {
				if r := byMsg[m]; r.Kind != kind {
					t.Errorf("%s: %s, want %s", names[m], describe(r), kind)
				}
			}
			if r := byMsg[a[0]]; r.Latency >= 100*time.Millisecond {
				t.Errorf("a1 delivered alone, latency %s: not its own re-send's", r.Latency)
			}
			for _, m := range u {
				if r := byMsg[m]; r.Kind != publish.Delivered {
					t.Errorf("%s: %s, want delivered", names[m], describe(r))
				}
			}
		})
	}
}

func TestBatcherAnUnansweredEntryIsRetryable(t *testing.T) {
	t.Parallel()
	msgs := unordered(3)
	b := publish.Batcher[*outboxtype.Message]{
		MaxEntries: 10, Concurrency: 1,
		Prepare: func(m *outboxtype.Message) (*outboxtype.Message, int, *publish.Result) { return m, 1, nil },
		Call: func(_ context.Context, _ []*outboxtype.Message, _ []*outboxtype.Message, results []publish.Result) bool {
			results[0], results[2] = publish.Ok("a"), publish.Ok("c")
			return false
		},
	}
	results := b.Publish(context.Background(), msgs)
	if r := results[1]; r.Kind != publish.Retryable || r.Code != outboxtype.CodeTarget5xx {
		t.Errorf("unanswered: %s, want retryable TARGET_5XX", describe(r))
	}
	if results[0].Kind != publish.Delivered || results[2].Kind != publish.Delivered {
		t.Errorf("answered: %s, %s", describe(results[0]), describe(results[2]))
	}
}

func TestBatcherEmptyMakesNoCall(t *testing.T) {
	t.Parallel()
	f := &fakeTarget{}
	if results := batcher(f, 10, 8).Publish(context.Background(), nil); len(results) != 0 {
		t.Errorf("%d results for no messages", len(results))
	}
	if n := len(f.sentCalls()); n != 0 {
		t.Errorf("%d calls for no messages", n)
	}
}

// Random batches of keys and unordered messages, in random order, against
// a target that fails some entries and answers at random speeds: every
// result obeys the contract, and no lane ever has two calls in flight or
// goes out of order.
func TestBatcherKeepsTheContractUnderLoad(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			var msgs []*outboxtype.Message
			var lanes [][]*outboxtype.Message
			for k := range 1 + rng.IntN(12) {
				l := keyMessages(fmt.Sprint("key-", k), 1+rng.IntN(25))
				lanes = append(lanes, l)
				msgs = append(msgs, l...)
			}
			msgs = append(msgs, unordered(rng.IntN(30))...)
			rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
			failing := map[*outboxtype.Message]publish.Result{}
			for _, m := range msgs {
				switch rng.IntN(40) {
				case 0:
					failing[m] = publish.Retry(outboxtype.CodeThrottled, errors.New("slow down"), 0)
				case 1:
					failing[m] = publish.Fail(outboxtype.CodeTargetRejected, errors.New("no"))
				}
			}
			delays := map[*outboxtype.Message]time.Duration{}
			for _, m := range msgs {
				delays[m] = time.Duration(rng.IntN(3000)) * time.Microsecond
			}
			f := &fakeTarget{
				answer: func(m *outboxtype.Message) publish.Result {
					if r, ok := failing[m]; ok {
						return r
					}
					return publish.Ok("ref")
				},
				before: func(_ context.Context, call []*outboxtype.Message) { time.Sleep(delays[call[0]]) },
			}
			maxEntries := []int{1, 3, 10}[rng.IntN(3)]
			byMsg := resultsOf(t, msgs, batcher(f, maxEntries, 1+rng.IntN(6)).Publish(context.Background(), msgs))
			f.checkNoOverlap(t)

			callOf := map[*outboxtype.Message]int{}
			for i, c := range f.sentCalls() {
				for j, m := range c {
					// A lane's entries in one call: consecutive, in order.
					if m.OrderingKey != "" && j > 0 && laneOf(c[j-1]) != laneOf(m) && slices.ContainsFunc(c[:j], func(e *outboxtype.Message) bool { return laneOf(e) == laneOf(m) }) {
						t.Errorf("call %d: %s's entries are not consecutive", i, m.OrderingKey)
					}
					if j > 0 && laneOf(c[j-1]) == laneOf(m) && c[j-1].SequenceID >= m.SequenceID {
						t.Errorf("call %d: %s%d after %s%d", i, m.OrderingKey, m.SequenceID, m.OrderingKey, c[j-1].SequenceID)
					}
					if _, twice := callOf[m]; twice {
						t.Errorf("%s%d sent twice", m.OrderingKey, m.SequenceID)
					}
					callOf[m] = i
				}
			}
			for _, l := range lanes {
				failedCall := -1
				for _, m := range l {
					r := byMsg[m]
					call, sent := callOf[m]
					if sent && r.Kind != publish.Released && r.Latency <= 0 {
						t.Errorf("%s%d: sent, latency %s", m.OrderingKey, m.SequenceID, r.Latency)
					}
					if failedCall < 0 {
						if failure, ok := failing[m]; ok {
							if r.Kind != failure.Kind || !sent {
								t.Errorf("%s%d: %s, want the target's %s", m.OrderingKey, m.SequenceID, describe(r), failure.Kind)
							}
							failedCall = call
						} else if r.Kind != publish.Delivered || !sent {
							t.Errorf("%s%d: %s (sent %t), want delivered", m.OrderingKey, m.SequenceID, describe(r), sent)
						}
						continue
					}
					_, targetFailed := failing[m]
					switch {
					case sent && call != failedCall:
						t.Errorf("%s%d: sent in call %d, after its key failed in call %d", m.OrderingKey, m.SequenceID, call, failedCall)
					case sent && !targetFailed && r.Kind != publish.Delivered:
						t.Errorf("%s%d: %s, but the target accepted it", m.OrderingKey, m.SequenceID, describe(r))
					case (!sent || targetFailed) && r.Kind != publish.Released:
						t.Errorf("%s%d: %s after its key's failure, want released", m.OrderingKey, m.SequenceID, describe(r))
					}
				}
				// Sent in sequence order: call indices never go back.
				last := -1
				for _, m := range l {
					if call, sent := callOf[m]; sent {
						if call < last {
							t.Errorf("%s%d went out in call %d, after call %d of an earlier message", m.OrderingKey, m.SequenceID, call, last)
						}
						last = call
					}
				}
			}
			for _, m := range msgs {
				if m.OrderingKey != "" {
					continue
				}
				want := publish.Delivered
				if failure, ok := failing[m]; ok {
					want = failure.Kind
				}
				if r := byMsg[m]; r.Kind != want {
					t.Errorf("unordered message: %s, want %s", describe(r), want)
				}
			}
		})
	}
}

// An answered call's entries are let go at once, not kept until the whole
// batch is sent: a webhook's entry is its request body, which holds the
// message's payload, and a batch's bodies together are as large as its
// payloads again. Checked with weak pointers: after a collection, no entry
// of a call already answered is still reachable from the Batcher.
func TestBatcherLetsGoOfAnsweredEntries(t *testing.T) {
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency %d", concurrency), func(t *testing.T) {
			msgs := unordered(12)
			var (
				mu       sync.Mutex
				entries  = map[uuid.UUID]weak.Pointer[[]byte]{}
				answered []uuid.UUID
				alive    []uuid.UUID
			)
			b := publish.Batcher[*[]byte]{
				MaxEntries: 1, Concurrency: concurrency,
				Prepare: func(m *outboxtype.Message) (*[]byte, int, *publish.Result) {
					body := make([]byte, 64<<10)
					mu.Lock()
					entries[m.ID] = weak.Make(&body)
					mu.Unlock()
					return &body, len(body), nil
				},
				Call: func(_ context.Context, ms []*outboxtype.Message, _ []*[]byte, results []publish.Result) bool {
					mu.Lock()
					defer mu.Unlock()
					if ms[0] == msgs[len(msgs)-1] {
						// The last call: every call answered before it has
						// been settled once the others in flight return.
						runtime.GC()
						for _, id := range answered {
							if entries[id].Value() != nil {
								alive = append(alive, id)
							}
						}
					}
					answered = append(answered, ms[0].ID)
					results[0] = publish.Ok("ref")
					return false
				},
			}
			results := b.Publish(context.Background(), msgs)
			for i, r := range results {
				if r.Kind != publish.Delivered {
					t.Fatalf("message %d: %+v", i, r)
				}
			}
			// The calls in flight beside the last one, or answered but not yet
			// settled when it started, may still hold theirs.
			if len(alive) > concurrency-1 {
				t.Fatalf("%d of the %d entries answered before the last call were still held, with %d calls at once: %v",
					len(alive), len(answered)-1, concurrency, alive)
			}
		})
	}
}
