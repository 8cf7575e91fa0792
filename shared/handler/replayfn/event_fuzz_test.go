package replayfn_test

import (
	"testing"

	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/replayfn"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/eventfuzz"
)

// The dead-letter replay's event is an operator's hand-written JSON.
// Whatever arrives, parsing must not panic; a refusal must be an
// *handler.EventError; what is accepted must be what replay_dead may be
// asked: a limit within bounds, a reason for a replay that moves messages,
// names that are names, a time window that is not empty, and a filter
// that is not empty unless "all" says so.
func FuzzParseEvent(f *testing.F) {
	for _, s := range append(eventfuzz.Seeds,
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
		req, err := replayfn.ParseEvent(raw, maxLimit)
		if err != nil {
			eventfuzz.MustBeEventError(t, "dlq-replay", err)
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
			var ev replayfn.Event
			if err := handler.DecodeEvent("dlq-replay", raw, &ev); err != nil || !ev.All {
				t.Fatalf("an empty filter accepted without all, from %q", raw)
			}
		}
	})
}
