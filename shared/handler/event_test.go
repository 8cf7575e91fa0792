package handler_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/reaperfn"
)

// nestedEnvelope wraps inner in depth EventBridge envelopes.
func nestedEnvelope(depth int, inner string) []byte {
	const open = `{"detail-type":"x","detail":`
	var b strings.Builder
	b.Grow(depth*(len(open)+1) + len(inner))
	b.WriteString(strings.Repeat(open, depth))
	b.WriteString(inner)
	b.WriteString(strings.Repeat("}", depth))
	return []byte(b.String())
}

func TestDecodeEventAcceptsOneEnvelopeLevel(t *testing.T) {
	t.Parallel()
	ev, err := reaperfn.ParseEvent(nestedEnvelope(1, `{"batch_size":50,"max_rounds":3}`))
	if err != nil || ev != (reaperfn.Event{BatchSize: 50, MaxRounds: 3}) {
		t.Fatalf("one envelope: %+v, %v; want batch_size 50, max_rounds 3", ev, err)
	}
	for _, detail := range []string{`{}`, `null`, ` {} `} {
		if ev, err := reaperfn.ParseEvent(nestedEnvelope(1, detail)); err != nil || ev != (reaperfn.Event{}) {
			t.Errorf("envelope with detail %s: %+v, %v; want an empty event", detail, ev, err)
		}
	}
	if ev, err := reaperfn.ParseEvent([]byte(`{"detail-type":"Scheduled Event","source":"aws.events"}`)); err != nil || ev != (reaperfn.Event{}) {
		t.Errorf("envelope without detail: %+v, %v; want an empty event", ev, err)
	}
}

// An envelope inside an envelope is refused at the second level, however
// deep the nesting goes. The deepest case is the reported event: 261 KB of
// envelopes nested just under encoding/json's depth limit, which the old
// decoder re-parsed at every level (27 s of CPU) and then accepted. Refusing
// at the second level reads the event a fixed number of times, so no timing
// is asserted here: the refusal and its reason are the proof.
func TestDecodeEventRefusesNestedEnvelopes(t *testing.T) {
	t.Parallel()
	const want = "detail holds another EventBridge event; only one envelope level is accepted"
	for _, tc := range []struct {
		depth int
		inner string
	}{
		{2, `{}`},
		{2, `{"batch_size":50}`},
		{3, `null`},
		{9_000, `{"batch_size":50}`},
	} {
		raw := nestedEnvelope(tc.depth, tc.inner)
		ev := reaperfn.Event{BatchSize: -1}
		err := handler.DecodeEvent("reaper", raw, &ev)
		var ee *handler.EventError
		if !errors.As(err, &ee) {
			t.Errorf("%d envelopes around %s (%d bytes): %v, %+v; want an *handler.EventError", tc.depth, tc.inner, len(raw), err, ev)
			continue
		}
		if ee.Function != "reaper" || ee.Problem != want {
			t.Errorf("%d envelopes around %s: %+v; want function reaper, problem %q", tc.depth, tc.inner, ee, want)
		}
		if ev != (reaperfn.Event{BatchSize: -1}) {
			t.Errorf("%d envelopes around %s: the refused event was decoded into %+v", tc.depth, tc.inner, ev)
		}
	}
}
