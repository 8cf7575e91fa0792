package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/sink"
	"github.com/outboxkit/dispatcher/shared/sink/faultsink"
)

// localSink is the plugin receiver of `outboxctl sink` and of the demo: the
// reference receiver (shared/sink: signature verification, dedupe by
// webhook-id) with a handler that refuses poison messages, behind the fault
// injector (shared/sink/faultsink) the demo injects failures through, which
// reports every answer to a recorder that prints and counts it.
type localSink struct {
	receiver http.Handler
	rules    []rejectRule
	delay    time.Duration
	out      io.Writer
	faults   sinkFaults

	mu        sync.Mutex
	printMu   sync.Mutex
	stats     sinkStats
	handled   map[string]int   // committed handler runs per key
	lastSeq   map[string]int64 // last sequence delivered per ordering key
	latencies []time.Duration  // enqueue → first delivery, per key
}

// sinkFaults are failures the demo injects, each on the first attempt of
// a deterministic share of the keys, so that a run shows retries and
// receiver-side deduplication.
type sinkFaults struct {
	// ThrottleEvery: every Nth key is answered 429 (not handled).
	ThrottleEvery int
	// LoseAckEvery: every Nth key is handled and recorded, but its 200 is
	// replaced by a 503, as if the answer were lost on its way back: the
	// dispatcher delivers again, and the receiver answers "duplicate".
	LoseAckEvery int
}

// sinkStats count a sink's answers.
type sinkStats struct {
	Requests   int `json:"requests"`
	Delivered  int `json:"delivered"`
	Duplicates int `json:"duplicates"`
	Rejected   int `json:"rejected"`
	Retry      int `json:"retry"`
	LostAcks   int `json:"lost_acks"`
	// MaxHandledPerKey is the most times one key's handler committed: 1
	// when every message took effect exactly once.
	MaxHandledPerKey int `json:"max_handled_per_key"`
	// OrderViolations counts deliveries of an ordering key whose sequence
	// id was not above the last one delivered.
	OrderViolations int `json:"order_violations"`
}

// rejectRule refuses payloads whose top-level field has a value.
type rejectRule struct{ field, value string }

func parseRejectRule(s string) (rejectRule, error) {
	field, value, ok := strings.Cut(s, "=")
	if !ok || field == "" {
		return rejectRule{}, usagef("--reject-if wants FIELD=VALUE (a top-level payload field), got %q", s)
	}
	return rejectRule{field: field, value: value}, nil
}

// matches compares the field's value as text: a string's content, or the
// JSON of anything else (true, 42).
func (r rejectRule) matches(payload json.RawMessage) bool {
	var fields map[string]json.RawMessage
	if json.Unmarshal(payload, &fields) != nil {
		return false
	}
	raw, ok := fields[r.field]
	if !ok {
		return false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s == r.value
	}
	return string(bytes.TrimSpace(raw)) == r.value
}

func (r rejectRule) String() string { return r.field + "=" + r.value }

// newLocalSink builds the receiver; out, when set, gets one line per
// request.
func newLocalSink(secret []byte, dedupe sink.Deduper, rules []rejectRule, delay time.Duration, out io.Writer, faults sinkFaults, log *slog.Logger) *localSink {
	s := &localSink{rules: rules, delay: delay, out: out, faults: faults,
		handled: map[string]int{}, lastSeq: map[string]int64{}}
	s.receiver = faultsink.New(secret, dedupe, s.handle, faultsink.Config{Pick: s.pick, Observe: s.observe}, sink.WithLogger(log))
	return s
}

// handle is the plugin's own logic: refuse poison, accept the rest.
func (s *localSink) handle(_ context.Context, env publish.Envelope) error {
	for _, r := range s.rules {
		if r.matches(env.Payload) {
			// The rule itself is the reason: short enough to read whole in
			// the dead-letter list.
			return sink.Reject(http.StatusUnprocessableEntity, errors.New(r.String()))
		}
	}
	return nil
}

// pick injects the demo's faults, on first attempts only so that every
// message is delivered in the end.
func (s *localSink) pick(c faultsink.Call) faultsink.Fault {
	env := c.Envelope
	switch {
	case env.Attempt != 1:
		return faultsink.Fault{}
	case every(env.Key, "throttle", s.faults.ThrottleEvery):
		return faultsink.Fault{Kind: faultsink.Throttle, Reason: "busy, try again (injected by the demo)"}
	case every(env.Key, "lost-ack", s.faults.LoseAckEvery):
		return faultsink.Fault{Kind: faultsink.LoseAnswer, Reason: "injected by the demo"}
	}
	return faultsink.Fault{}
}

// every picks every nth key, the same keys on every run.
func every(key, salt string, n int) bool {
	if n <= 0 {
		return false
	}
	h := fnv.New32a()
	h.Write([]byte(salt))
	h.Write([]byte(key))
	return h.Sum32()%uint32(n) == 0
}

func (s *localSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-r.Context().Done():
			return
		}
	}
	s.receiver.ServeHTTP(w, r)
}

// observe records and prints every answer.
func (s *localSink) observe(o faultsink.Outcome) {
	s.record(o)
	outcome := o.Answer
	if outcome == "" {
		outcome = http.StatusText(o.Status)
	}
	detail := o.Error
	if o.AnswerLost {
		detail = "answer replaced by 503 (injected by the demo): the delivery is recorded, the dispatcher will send it again"
	}
	s.print(o.Received, o.Status, outcome, o.Envelope, detail)
}

func (s *localSink) record(o faultsink.Outcome) {
	env := o.Envelope
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Requests++
	switch {
	case o.Status == http.StatusOK && o.Duplicate:
		s.stats.Duplicates++
	case o.Status == http.StatusOK:
		s.stats.Delivered++
		s.handled[env.Key]++
		s.stats.MaxHandledPerKey = max(s.stats.MaxHandledPerKey, s.handled[env.Key])
		if !env.CreatedAt.IsZero() {
			s.latencies = append(s.latencies, o.Received.Sub(env.CreatedAt))
		}
		if env.OrderingKey != "" {
			if last, seen := s.lastSeq[env.OrderingKey]; seen && env.SequenceID <= last {
				s.stats.OrderViolations++
			}
			s.lastSeq[env.OrderingKey] = env.SequenceID
		}
		if o.AnswerLost {
			s.stats.LostAcks++
		}
	case o.Status == http.StatusTooManyRequests || o.Status >= 500:
		s.stats.Retry++
	default:
		s.stats.Rejected++
	}
}

func (s *localSink) print(at time.Time, status int, outcome string, env publish.Envelope, detail string) {
	if s.out == nil {
		return
	}
	line := fmt.Sprintf("%s %d %-9s", at.Format("15:04:05.000"), status, outcome)
	if env.ID != "" {
		line += fmt.Sprintf("  id=%s key=%s %s/%s attempt=%d", env.ID, env.Key, env.Namespace, env.Topic, env.Attempt)
	}
	if detail != "" {
		line += "  " + detail
	}
	s.printMu.Lock()
	fmt.Fprintln(s.out, line)
	s.printMu.Unlock()
}

// snapshot returns the counts so far and the latencies.
func (s *localSink) snapshot() (sinkStats, []time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats, append([]time.Duration(nil), s.latencies...)
}

// hasHandled reports whether key's handler committed.
func (s *localSink) hasHandled(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handled[key] > 0
}

// handledKeys returns how many distinct keys were handled.
func (s *localSink) handledKeys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.handled)
}
