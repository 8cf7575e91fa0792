package dispatchfn_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/fanout"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// OUTBOX_ATTEMPT_CEILING bounds the routes' max_attempts at the cold start,
// both ways: below the ceiling the store would dead-letter a message before
// its route's last attempt, and above the default a route may now ask for
// more attempts.
func TestTheAttemptCeilingBoundsTheRoutes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, tc := range []struct {
		ceiling     string // "" leaves the variable unset
		maxAttempts int
		refusal     string // "" when the cold start succeeds
	}{
		{"50", 80, "routes[0].retry.max_attempts: must be at most 50 (the database's attempt ceiling), got 80"},
		{"50", 50, ""},
		{"1000", 500, ""},
		{"1000", 1001, "routes[0].retry.max_attempts: must be at most 1000 (the database's attempt ceiling), got 1001"},
		{"", 100, ""},
		{"", 101, "routes[0].retry.max_attempts: must be at most 100 (the database's attempt ceiling), got 101"},
	} {
		t.Run(fmt.Sprintf("ceiling %q max_attempts %d", tc.ceiling, tc.maxAttempts), func(t *testing.T) {
			t.Parallel()
			vars := map[string]string{
				"OUTBOX_DATABASE_URL":    db.URL,
				"OUTBOX_TRACING":         "off",
				"OUTBOX_ATTEMPT_CEILING": tc.ceiling,
				"OUTBOX_ROUTES": fmt.Sprintf(`{"routes": [{"match": {"namespace": "*", "topic": "*"},
					"target": {"type": "eventbridge", "event_bus": "default"}, "retry": {"max_attempts": %d}}]}`, tc.maxAttempts),
			}
			var h *dispatchfn.Handler
			cfg, err := dispatchconfig.Load(config.Env{Getenv: func(k string) string { return vars[k] }})
			if err == nil {
				var closeFn func()
				if h, closeFn, err = dispatchfn.New(context.Background(), cfg, handler.Deps{Stdout: io.Discard}); err == nil {
					closeFn()
				}
			}
			switch {
			case tc.refusal == "" && err != nil:
				t.Fatalf("cold start refused: %v", err)
			case tc.refusal == "" && h.Engine == nil:
				t.Fatal("no engine")
			case tc.refusal != "" && (err == nil || !strings.Contains(err.Error(), "\n"+tc.refusal)):
				t.Fatalf("cold start error = %v\nwant one with the line %s", err, tc.refusal)
			}
		})
	}
}

// The fan-out event (events/dispatch-fanout.json) is what a worker starts
// with: it decodes to a generation-1 worker, and anything else that claims
// to be one is refused, naming the field.
func TestParseFanOutEvent(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../../events/dispatch-fanout.json")
	if err != nil {
		t.Fatal(err)
	}
	ev, err := dispatchfn.ParseEvent(raw)
	if err != nil || !ev.Worker() || ev.Generation != 1 || ev.Reason != fanout.ReasonBacklog || ev.Backlog != 240000 {
		t.Fatalf("events/dispatch-fanout.json: %+v, %v", ev, err)
	}
	if ev, err := dispatchfn.ParseEvent([]byte(`{}`)); err != nil || ev.Worker() || ev.Generation != 0 {
		t.Errorf("a scheduled event: %+v, %v; want generation 0, not a worker", ev, err)
	}
	for raw, want := range map[string]string{
		`{"source":"aws.events"}`: `source must be "outbox.fanout" or absent, got "aws.events"`,
		`{"generation":2}`:        "generation, reason and backlog belong to a fan-out event",
		`{"source":"outbox.fanout","generation":0,"reason":"backlog"}`:  "generation must be between 1 and 10, got 0",
		`{"source":"outbox.fanout","generation":11,"reason":"backlog"}`: "generation must be between 1 and 10, got 11",
		`{"source":"outbox.fanout","generation":1,"reason":"boredom"}`:  `reason must be "backlog", got "boredom"`,
	} {
		if _, err := dispatchfn.ParseEvent([]byte(raw)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %s", raw, err, want)
		}
	}
}
