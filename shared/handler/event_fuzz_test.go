package handler_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/testkit/eventfuzz"
)

// The metrics exporter's event is the empty one: what DecodeEvent accepts
// into an empty struct. It is input from outside (a schedule, an
// operator's hand-written JSON): whatever arrives, decoding must not panic
// and a refusal must be an *handler.EventError.

// FuzzDecodeMetricsEvent: the metrics function takes no fields at all, so
// DecodeEvent into an empty struct must accept exactly the empty events
// (nothing, null, {}, and one EventBridge envelope of those) and refuse the
// rest — checked against an independent reading of the JSON.
func FuzzDecodeMetricsEvent(f *testing.F) {
	for _, s := range append(eventfuzz.Seeds, `{"top_n":5}`, `{"detail-type":"x","detail":{"a":1}}`, "\t\n null \n") {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var ev struct{}
		err := handler.DecodeEvent("metrics", raw, &ev)
		if err != nil {
			eventfuzz.MustBeEventError(t, "metrics", err)
		}
		if want := isEmptyEvent(raw); (err == nil) != want {
			t.Fatalf("DecodeEvent(%q) = %v; an empty event: %v", raw, err, want)
		}
	})
}

var envelopeFields = map[string]bool{
	"version": true, "id": true, "detail-type": true, "source": true, "account": true,
	"time": true, "region": true, "resources": true, "detail": true,
}

// isEmptyEvent is the oracle for FuzzDecodeMetricsEvent: nothing, null, {}
// or one EventBridge envelope whose detail is one of those. An envelope in
// detail is not empty: only one envelope level is accepted.
func isEmptyEvent(raw []byte) bool {
	obj, ok := emptyOrObject(raw)
	if !ok || obj == nil {
		return ok
	}
	if _, ok := obj["detail-type"]; !ok {
		return len(obj) == 0
	}
	for k := range obj {
		if !envelopeFields[k] {
			return false
		}
	}
	detail, ok := emptyOrObject(obj["detail"])
	return ok && len(detail) == 0
}

// emptyOrObject reads raw as nothing or null (nil, true), a JSON object
// (its fields, true) or something else (false).
func emptyOrObject(raw []byte) (map[string]json.RawMessage, bool) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return nil, true
	}
	if trimmed[0] != '{' || !json.Valid(trimmed) {
		return nil, false
	}
	obj := map[string]json.RawMessage{}
	if json.Unmarshal(trimmed, &obj) != nil {
		return nil, false
	}
	return obj, true
}
