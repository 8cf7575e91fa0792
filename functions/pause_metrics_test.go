package functions_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/emftest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// The metrics function shows a paused namespace's messages as
// PausedMessages, overall and under their topic, leaves them out of the
// oldest age (a pause must not fire the oldest-age alarm), and says who
// paused what and why in its answer and its log.
func TestMetricsShowPausedMessagesWithWhoAndWhy(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	enqueue(t, db.Pool, 3, func(i int) outbox.Message {
		return outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(`{"n":1}`)}
	})
	// The paused messages waited an hour; the one due message is new.
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.pending SET available_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, 1, func(i int) outbox.Message {
		return outbox.Message{Namespace: "audit", Topic: "login", Payload: json.RawMessage(`{"n":1}`)}
	})
	store := lease.NewStore(db.Pool)
	if _, err := store.Pause(ctx, lease.PauseRequest{Namespace: "billing", Reason: "INC-7: billing endpoint down", Operator: "ana"}); err != nil {
		t.Fatal(err)
	}

	fn := start(t, "metrics", env(db)...)
	var snap struct {
		Totals struct {
			Pending                 int64   `json:"pending"`
			Due                     int64   `json:"due"`
			Paused                  int64   `json:"paused"`
			OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
		} `json:"totals"`
		Pauses []lease.Pause `json:"pauses"`
	}
	invoke(t, fn, event(t, "metrics-schedule.json"), 20*time.Second, &snap)
	if snap.Totals.Pending != 4 || snap.Totals.Due != 1 || snap.Totals.Paused != 3 || snap.Totals.OldestPendingAgeSeconds > 600 {
		t.Errorf("snapshot totals %+v: want 4 pending, 1 due, 3 paused, and the paused hour out of the oldest age", snap.Totals)
	}
	if len(snap.Pauses) != 1 || snap.Pauses[0].Namespace != "billing" || snap.Pauses[0].Topic != "*" || snap.Pauses[0].PausedBy != "ana" ||
		snap.Pauses[0].Reason != "INC-7: billing endpoint down" || snap.Pauses[0].Messages != 3 || snap.Pauses[0].DBUser == "" {
		t.Errorf("snapshot pauses %+v", snap.Pauses)
	}

	out := awaitOutput(t, fn, `"queue snapshot"`, 1)
	var emfLines []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, `"_aws"`) {
			emfLines = append(emfLines, line)
		}
	}
	var overall, billing, oldest float64 = -1, -1, -1
	for _, d := range emftest.Parse(t, []byte(strings.Join(emfLines, "\n")+"\n")) {
		if mv, ok := d.Metrics["PausedMessages"]; ok {
			switch d.Dimensions["Namespace"] {
			case "":
				overall = mv.Values[0]
			case "billing":
				billing = mv.Values[0]
			}
		}
		if mv, ok := d.Metrics["OldestPendingAgeSeconds"]; ok && d.Dimensions["Namespace"] == "" {
			oldest = mv.Values[0]
		}
	}
	if overall != 3 || billing != 3 || oldest < 0 || oldest > 600 {
		t.Errorf("EMF PausedMessages overall %v, billing/usage %v, OldestPendingAgeSeconds %v; want 3, 3 and under 10 minutes", overall, billing, oldest)
	}
	if !strings.Contains(out, `"message":"paused"`) || !strings.Contains(out, `"reason":"INC-7: billing endpoint down"`) || !strings.Contains(out, `"paused_by":"ana"`) {
		t.Errorf("the metrics log does not say who paused what and why:\n%s", out)
	}
}
