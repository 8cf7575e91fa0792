package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// A routes file that covers only some of the pending namespaces/topics
// would send the rest through NO_ROUTE: invoke dispatch says so first, and
// the rest are held, not dead-lettered.
func TestInvokeDispatchWarnsOfUnroutedTopics(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	_, url := startSink(t, 0)
	for i := range 3 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	for i := range 2 {
		enqueueMessages(t, d.Pool, outbox.Message{Namespace: "audit", Topic: "login", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	env := db(d.URL, "OUTBOX_ROUTES", routesTo(url), "SINK_SECRET", testSecret, "OUTBOX_LOG_LEVEL", "error")

	r := cli(t, env, "invoke", "dispatch")
	r.wantOK(t, "invoke dispatch", "warning: 2 pending messages in audit/login match no route: dispatch will hold them as NO_ROUTE", `"delivered": 3`)
	if strings.Contains(r.out, "billing/usage_snapshot match no route") {
		t.Errorf("invoke dispatch warns of a routed topic:\n%s", r.out)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending WHERE namespace = 'audit' AND last_error_code = 'NO_ROUTE'`); n != 2 {
		t.Errorf("%d audit messages pending with NO_ROUTE, want both held", n)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.dead`); n != 0 {
		t.Errorf("%d dead letters: NO_ROUTE dead-lettered messages", n)
	}

	// Routes covering everything pending: no warning.
	everything := db(d.URL, "OUTBOX_ROUTES", strings.Replace(routesTo(url), `"namespace":"billing"`, `"namespace":"*"`, 1),
		"SINK_SECRET", testSecret, "OUTBOX_LOG_LEVEL", "error")
	if r := cli(t, everything, "invoke", "dispatch"); strings.Contains(r.out, "warning:") {
		t.Errorf("invoke dispatch with routes for everything warns:\n%s", r.out)
	}
	// A dispatcher confined to billing (OUTBOX_NAMESPACES) never claims
	// audit: nothing to warn of.
	confined := db(d.URL, "OUTBOX_ROUTES", routesTo(url), "SINK_SECRET", testSecret, "OUTBOX_LOG_LEVEL", "error", "OUTBOX_NAMESPACES", "billing")
	enqueueMessages(t, d.Pool, outbox.Message{Namespace: "audit", Topic: "logout", Payload: json.RawMessage(`{}`)})
	if r := cli(t, confined, "invoke", "dispatch"); strings.Contains(r.out, "warning:") {
		t.Errorf("invoke dispatch confined to billing warns of audit:\n%s", r.out)
	}
}

// The migrate function's handler runs in-process as the others do: {}
// applies, the status event lists.
func TestInvokeMigrate(t *testing.T) {
	t.Parallel()
	env := db(pgtest.NewEmpty(t))
	cli(t, env, "invoke", "migrate", "--event", "../../events/migrate-status.json").wantOK(t, "invoke migrate (status)", `"action": "status"`, `"version": 0`)
	r := cli(t, env, "invoke", "migrate")
	r.wantOK(t, "invoke migrate", `"action": "up"`, `"00001_baseline.sql"`, `"pending": 0`)
	cli(t, env, "migrate", "status", "--check").wantOK(t, "migrate status --check after invoke migrate")
	cli(t, env, "invoke", "migrate", "--event", "../../events/migrate-up.json").wantOK(t, "invoke migrate again", `"applied": []`)
	cli(t, invocation{env: env.env, stdin: `{"action":"down"}`}, "invoke", "migrate", "--event", "-").wantError(t, "invoke migrate down", 2, "action must be up or status")
}
