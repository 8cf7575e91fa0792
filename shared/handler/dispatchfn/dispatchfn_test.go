package dispatchfn_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/fanout"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
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

// A stack that claims only its own namespaces (OUTBOX_NAMESPACES) sizes
// its fan-out by their backlog, not by what another stack on the same
// database has queued.
func TestFanOutCountsOnlyTheFunctionsNamespaces(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	msg := func(namespace string) func(int) outbox.Message {
		return func(i int) outbox.Message {
			return outbox.Message{Namespace: namespace, Topic: "usage", DedupeKey: fmt.Sprintf("%s-%d", namespace, i),
				Payload: json.RawMessage(`{"tokens":1}`)}
		}
	}
	for namespace, n := range map[string]int{"billing": 300, "shipping": 3000} {
		build := msg(namespace)
		for from := 0; from < n; from += 1000 {
			var batch []outbox.Message
			for i := from; i < min(n, from+1000); i++ {
				batch = append(batch, build(i))
			}
			if _, err := outbox.EnqueueBatch(ctx, db.Pool, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(target.Close)
	invoker := lambdafake.New(t)
	const function = "billing-stack-dispatch"
	invoker.Handle(function, func([]byte) (int, []byte, string) { return 202, nil, "" })
	vars := map[string]string{
		"OUTBOX_DATABASE_URL": db.URL, "OUTBOX_TRACING": "off", "HOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		"OUTBOX_ROUTES": fmt.Sprintf(`{"routes": [{"match": {"namespace": "billing", "topic": "*"},
			"target": {"type": "http", "url": %q, "signing_secret_env": "HOOK_SECRET"}}]}`, target.URL),
		"OUTBOX_NAMESPACES": "billing", "OUTBOX_BATCH_SIZE": "100", "OUTBOX_MAX_BATCHES": "1",
		"OUTBOX_MAX_WORKERS": "8", "OUTBOX_FUNCTION_TIMEOUT": "75s", "AWS_LAMBDA_FUNCTION_NAME": function,
	}
	cfg, err := dispatchconfig.Load(config.Env{Getenv: func(k string) string { return vars[k] }})
	if err != nil {
		t.Fatal(err)
	}
	awsCfg := invoker.Config()
	h, closeFn, err := dispatchfn.New(ctx, cfg, handler.Deps{Stdout: io.Discard, AWS: &awsCfg})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	answer, err := h.Handle(runCtx, json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if answer.Delivered != 100 || answer.FanOut == nil {
		t.Fatalf("answer %+v, fan-out %+v: want one batch of billing delivered, then a fan-out decision", answer.Summary, answer.FanOut)
	}
	if answer.FanOut.Backlog != 200 {
		t.Errorf("the fan-out counted a backlog of %d, want billing's 200 left (shipping's 3000 are another stack's)", answer.FanOut.Backlog)
	}
	for _, inv := range invoker.Invocations() {
		var ev fanout.Event
		if err := json.Unmarshal(inv.Payload, &ev); err != nil || len(ev.Namespaces) != 1 || ev.Namespaces[0] != "billing" {
			t.Errorf("a worker was started with %s, want namespaces [billing]", inv.Payload)
		}
	}
}
