package handler_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/outbox"
)

// The Lambda events of the reaper, the dead-letter replay and the metrics
// exporter are input from outside (a schedule, an operator's hand-written
// JSON). Whatever arrives, parsing must not panic; a refusal must be an
// *handler.EventError (its type name is Lambda's errorType, and it means
// "nothing was changed"); and what is accepted must be within the bounds
// the handlers rely on. Every accepted event must also survive a round
// trip: re-encoded and parsed again, it means the same.

// eventSeeds are shapes every event parser sees: the events/ samples,
// an EventBridge envelope, and the malformations that matter.
var eventSeeds = []string{
	``, `null`, `{}`, ` {} `, `[]`, `"x"`, `1`, `{`, `{}{}`, `{} x`, `nul`,
	`{"detail-type":"Scheduled Event","source":"aws.events","detail":{}}`,
	`{"version":"0","id":"53dc4d37","detail-type":"Scheduled Event","source":"aws.events","account":"123456789012","time":"2026-11-21T03:00:00Z","region":"eu-west-1","resources":["arn:aws:events:eu-west-1:123456789012:rule/x"],"detail":{}}`,
	`{"detail-type":"Scheduled Event","detail":null}`,
	`{"detail-type":"Scheduled Event","detail":"{}"}`,
	`{"detail-type":"Scheduled Event","detail":{"detail-type":"nested","detail":{}}}`,
	`{"detail-type":"x","extra":1}`,
	`{"Detail-Type":"x"}`,
	`{"unknown":1}`,
	"{\"a\":\"\xff\"}",
}

func FuzzParseReaperEvent(f *testing.F) {
	for _, s := range append(eventSeeds,
		`{"batch_size":1000,"max_rounds":10}`, `{"batch_size":0}`, `{"batch_size":-1}`, `{"batch_size":100001}`,
		`{"max_rounds":1001}`, `{"batch_size":1e3}`, `{"batch_size":"10"}`, `{"batch_size":9223372036854775808}`,
		`{"BATCH_SIZE":5}`, `{"batch_size":5,"batch_size":7}`,
		`{"detail-type":"Scheduled Event","detail":{"batch_size":50}}`) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ev, err := handler.ParseReaperEvent(raw)
		if err != nil {
			mustBeEventError(t, "reaper", err)
			return
		}
		if ev.BatchSize < 0 || ev.BatchSize > 100_000 || ev.MaxRounds < 0 || ev.MaxRounds > 1000 {
			t.Fatalf("accepted out of range: %+v from %q", ev, raw)
		}
		again, err := handler.ParseReaperEvent(mustJSON(t, ev))
		if err != nil || again != ev {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, ev)
		}
	})
}

func FuzzParseReplayEvent(f *testing.F) {
	for _, s := range append(eventSeeds,
		`{"message_ids":["0190d2a4-3c1e-7b8a-9f00-1234567890ab"],"dry_run":true}`,
		`{"namespace":"billing","topic":"usage","error_code":"TARGET_5XX","limit":50,"dry_run":false,"reason":"target fixed","operator":"alice"}`,
		`{"failed_after":"2026-11-20T00:00:00Z","failed_before":"2026-11-21T00:00:00Z"}`,
		`{"failed_after":"2026-11-21T00:00:00Z","failed_before":"2026-11-21T00:00:00Z"}`,
		`{"failed_after":"yesterday"}`, `{"all":true}`, `{"all":true,"dry_run":false}`, `{"all":false}`,
		`{"message_ids":["not-a-uuid"]}`, `{"message_ids":[]}`, `{"message_ids":null,"all":true}`,
		`{"namespace":"*"}`, `{"namespace":"a b"}`, `{"topic":"t","limit":-1}`, `{"topic":"t","limit":100000}`,
		`{"topic":"t","dry_run":null}`, `{"topic":"t","dry_run":"false"}`,
		`{"detail-type":"x","detail":{"all":true}}`) {
		f.Add([]byte(s), 1000)
	}
	f.Add([]byte(`{"topic":"t","limit":5}`), 1)
	f.Fuzz(func(t *testing.T, raw []byte, maxLimit int) {
		if maxLimit < 1 || maxLimit > 10_000 {
			t.Skip("OUTBOX_REPLAY_MAX_LIMIT is 1-10000")
		}
		req, err := handler.ParseReplayEvent(raw, maxLimit)
		if err != nil {
			mustBeEventError(t, "dlq-replay", err)
			return
		}
		// What an accepted event may ask of replay_dead.
		if req.Limit < 1 || req.Limit > maxLimit {
			t.Fatalf("limit %d outside 1-%d, from %q", req.Limit, maxLimit, raw)
		}
		if !req.DryRun && req.Reason == "" {
			t.Fatalf("a replay that moves messages without a reason, from %q", raw)
		}
		for _, name := range []string{req.Namespace, req.Topic} {
			if name != "" && !outbox.NamePattern.MatchString(name) {
				t.Fatalf("namespace or topic %q is not a name, from %q", name, raw)
			}
		}
		if !req.FailedAfter.IsZero() && !req.FailedBefore.IsZero() && !req.FailedAfter.Before(req.FailedBefore) {
			t.Fatalf("an empty time window accepted, from %q", raw)
		}
		empty := len(req.MessageIDs) == 0 && req.Namespace == "" && req.Topic == "" && req.ErrorCode == "" &&
			req.FailedAfter.IsZero() && req.FailedBefore.IsZero()
		if empty {
			// An empty filter is accepted only with "all": true.
			var ev handler.ReplayEvent
			if err := handler.DecodeEvent("dlq-replay", raw, &ev); err != nil || !ev.All {
				t.Fatalf("an empty filter accepted without all, from %q", raw)
			}
		}
	})
}

// FuzzDecodeMetricsEvent: the metrics function takes no fields at all, so
// DecodeEvent into an empty struct must accept exactly the empty events
// (nothing, null, {}, and one EventBridge envelope of those) and refuse the
// rest — checked against an independent reading of the JSON.
func FuzzDecodeMetricsEvent(f *testing.F) {
	for _, s := range append(eventSeeds, `{"top_n":5}`, `{"detail-type":"x","detail":{"a":1}}`, "\t\n null \n") {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var ev struct{}
		err := handler.DecodeEvent("metrics", raw, &ev)
		if err != nil {
			mustBeEventError(t, "metrics", err)
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

func mustBeEventError(t *testing.T, function string, err error) {
	t.Helper()
	var ee *handler.EventError
	if !errors.As(err, &ee) {
		t.Fatalf("refused with %T (%v), want *handler.EventError", err, err)
	}
	if ee.Function != function || ee.Problem == "" {
		t.Fatalf("EventError %+v: want function %q and a problem", ee, function)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
