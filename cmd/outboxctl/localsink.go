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
)

// localSink is the plugin receiver of `outboxctl sink` and of the demo: the
// reference receiver (shared/sink: signature verification, dedupe by
// webhook-id) with a handler that refuses poison messages, in front of a
// recorder that prints and counts every answer. The demo also injects
// failures through it.
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
	s.receiver = sink.NewReceiver(secret, dedupe, s.handle, sink.WithLogger(log))
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
	if env.Attempt == 1 && every(env.Key, "throttle", s.faults.ThrottleEvery) {
		return sink.RetryLater(0, errors.New("busy, try again (injected by the demo)"))
	}
	return nil
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
	received := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, sink.DefaultMaxBodyBytes+1))
	if err != nil {
		http.Error(w, "could not read the body", http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	// For display and counting only: the receiver decides with the
	// verified body.
	var env publish.Envelope
	_ = json.Unmarshal(body, &env)
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-r.Context().Done():
			return
		}
	}

	rec := &responseRecorder{header: http.Header{}}
	s.receiver.ServeHTTP(rec, r)
	duplicate := rec.header.Get(sink.DuplicateHeader) == "true"
	var answer struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	_ = json.Unmarshal(rec.body.Bytes(), &answer)
	outcome := answer.Status
	if outcome == "" {
		outcome = http.StatusText(rec.status)
	}
	lostAck := rec.status == http.StatusOK && !duplicate && env.Attempt == 1 && every(env.Key, "lost-ack", s.faults.LoseAckEvery)
	s.record(rec.status, duplicate, lostAck, env, received)
	if lostAck {
		answer.Error = "answer replaced by 503 (injected by the demo): the delivery is recorded, the dispatcher will send it again"
		http.Error(w, "answer lost (injected by the demo)", http.StatusServiceUnavailable)
	} else {
		rec.writeTo(w)
	}
	s.print(received, rec.status, outcome, env, answer.Error)
}

func (s *localSink) record(status int, duplicate, lostAck bool, env publish.Envelope, received time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Requests++
	switch {
	case status == http.StatusOK && duplicate:
		s.stats.Duplicates++
	case status == http.StatusOK:
		s.stats.Delivered++
		s.handled[env.Key]++
		s.stats.MaxHandledPerKey = max(s.stats.MaxHandledPerKey, s.handled[env.Key])
		if !env.CreatedAt.IsZero() {
			s.latencies = append(s.latencies, received.Sub(env.CreatedAt))
		}
		if env.OrderingKey != "" {
			if last, seen := s.lastSeq[env.OrderingKey]; seen && env.SequenceID <= last {
				s.stats.OrderViolations++
			}
			s.lastSeq[env.OrderingKey] = env.SequenceID
		}
		if lostAck {
			s.stats.LostAcks++
		}
	case status == http.StatusTooManyRequests || status >= 500:
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

// responseRecorder keeps the receiver's answer so that the sink can print
// it — or, for the demo, replace it.
type responseRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *responseRecorder) Header() http.Header { return r.header }

func (r *responseRecorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *responseRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

func (r *responseRecorder) writeTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	if r.status == 0 {
		r.status = http.StatusOK
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}
