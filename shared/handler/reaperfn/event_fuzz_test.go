package reaperfn_test

import (
	"encoding/json"
	"testing"

	"github.com/outboxkit/dispatcher/shared/handler/reaperfn"
	"github.com/outboxkit/dispatcher/shared/testkit/eventfuzz"
)

// The reaper's event is input from outside (a schedule, an operator's
// hand-written JSON). Whatever arrives, parsing must not panic; a refusal
// must be an *handler.EventError; what is accepted must be within the
// bounds the handler relies on, and survive a round trip: re-encoded and
// parsed again, it means the same.
func FuzzParseEvent(f *testing.F) {
	for _, s := range append(eventfuzz.Seeds,
		`{"batch_size":1000,"max_rounds":10}`, `{"batch_size":0}`, `{"batch_size":-1}`, `{"batch_size":100001}`,
		`{"max_rounds":1001}`, `{"batch_size":1e3}`, `{"batch_size":"10"}`, `{"batch_size":9223372036854775808}`,
		`{"BATCH_SIZE":5}`, `{"batch_size":5,"batch_size":7}`,
		`{"detail-type":"Scheduled Event","detail":{"batch_size":50}}`) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ev, err := reaperfn.ParseEvent(raw)
		if err != nil {
			eventfuzz.MustBeEventError(t, "reaper", err)
			return
		}
		if ev.BatchSize < 0 || ev.BatchSize > 100_000 || ev.MaxRounds < 0 || ev.MaxRounds > 1000 {
			t.Fatalf("accepted out of range: %+v from %q", ev, raw)
		}
		again, err := reaperfn.ParseEvent(mustJSON(t, ev))
		if err != nil || again != ev {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, ev)
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
