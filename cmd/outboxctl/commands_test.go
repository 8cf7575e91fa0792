package main

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/outboxkit/dispatcher/shared/gate"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/handler/replayfn"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestEnqueueFromFlagsAndStdin(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)

	args := []string{"enqueue", "--namespace", "billing", "--topic", "usage_snapshot", "--payload", `{"tokens":12}`,
		"--tenant", "t-1", "--dedupe-key", "t-1/turn-1", "--ordering-key", "billing:t-1", "--header", "region=eu", "--header", "schema=usage/v1"}
	first := cli(t, env, args...)
	first.wantOK(t, "enqueue from flags", "ID", "SEQUENCE", "INSERTED", "yes")
	again := cli(t, env, args...)
	again.wantOK(t, "the same dedupe key again", "no: dedupe key already enqueued")
	firstID := strings.Fields(strings.Split(first.out, "\n")[1])[0]
	if !strings.Contains(again.out, firstID) {
		t.Errorf("the repeat did not print the first message's id %s:\n%s", firstID, again.out)
	}
	var headers, tenant string
	var seq int64
	if err := d.Pool.QueryRow(context.Background(), `SELECT headers::text, tenant_id, sequence_id FROM outbox.pending WHERE id = $1`, firstID).Scan(&headers, &tenant, &seq); err != nil {
		t.Fatal(err)
	}
	if headers != `{"region": "eu", "schema": "usage/v1"}` || tenant != "t-1" || seq != 1 {
		t.Errorf("stored headers %s, tenant %s, sequence %d", headers, tenant, seq)
	}

	payloadFile := filepath.Join(t.TempDir(), "invoice.json")
	if err := os.WriteFile(payloadFile, []byte(`{"invoice":"inv-7"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	later := cli(t, env, "enqueue", "--namespace", "billing", "--topic", "invoice", "--payload", "@"+payloadFile, "--available-at", "1h", "--json")
	later.wantOK(t, "enqueue @file, later, --json", `"inserted":true`)
	var line enqueued
	if err := json.Unmarshal([]byte(later.out), &line); err != nil || line.SequenceID != nil {
		t.Fatalf("--json line %q: %v", later.out, err)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending WHERE id = $1 AND next_attempt_at > now() + interval '50 minutes' AND payload->>'invoice' = 'inv-7'`, line.MessageID); n != 1 {
		t.Errorf("the --available-at 1h message is not scheduled an hour out")
	}

	stdin := strings.Join([]string{
		`{"namespace":"billing","topic":"usage_snapshot","payload":{"tokens":1},"dedupe-key":"k1","ordering-key":"billing:t-1"}`,
		``,
		`{"namespace":"billing","topic":"usage_snapshot","payload":{"tokens":2},"dedupe-key":"k2","header":{"region":"us"},"tenant":"t-2"}`,
		`{"namespace":"billing","topic":"usage_snapshot","payload":{"tokens":1},"dedupe-key":"k1"}`,
	}, "\n")
	lines := cli(t, invocation{env: env.env, stdin: stdin}, "enqueue")
	lines.wantOK(t, "enqueue from stdin", "2 enqueued, 1 duplicate suppressed")
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending WHERE dedupe_key IN ('k1', 'k2')`); n != 2 {
		t.Errorf("%d of the stdin messages stored, want 2", n)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending WHERE dedupe_key = 'k1' AND sequence_id = 2`); n != 1 {
		t.Errorf("k1 is not the second message of ordering key billing:t-1")
	}
}

func TestEnqueueBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	good := `{"namespace":"billing","topic":"usage_snapshot","payload":{"tokens":1}}`
	cases := []struct {
		name  string
		stdin string
		args  []string
		code  int
		want  string
	}{
		{"malformed JSON line", good + "\n{\"namespace\": \n" + good, nil, 2, "line 2: not valid JSON"},
		{"unknown field", good + "\n" + `{"namespace":"billing","topic":"t","payload":{},"dedupe_key":"k"}`, nil, 2,
			`line 2: unknown field "dedupe_key"; the fields are named as the flags: namespace, topic, payload, tenant, dedupe-key`},
		{"missing topic", good + "\n" + good + "\n" + `{"namespace":"billing","payload":{}}`, nil, 2, "line 3: topic is required"},
		{"invalid namespace", good + "\n" + `{"namespace":"bad name","topic":"t","payload":{}}`, nil, 2, `line 2: namespace "bad name" must be 1-128 characters`},
		{"payload not a document", `{"namespace":"billing","topic":"t","payload":"text"}`, nil, 2, "line 1: payload"},
		{"two objects on a line", good + good, nil, 2, "line 1: more than one JSON value"},
		{"wrong type", `{"namespace":"billing","topic":"t","payload":{},"header":{"a":1}}`, nil, 2, `line 1: field "header" must be string, got a JSON number`},
		{"bad header name", `{"namespace":"billing","topic":"t","payload":{},"header":{"webhook-id":"x"}}`, nil, 2, "line 1: header"},
		{"empty stdin", "\n\n", nil, 2, "no messages on stdin"},
		{"flags without payload", "", []string{"--namespace", "billing", "--topic", "t"}, 2, "--payload is required"},
		{"flags with bad JSON", "", []string{"--namespace", "billing", "--topic", "t", "--payload", "{"}, 2, "--payload is not valid JSON"},
		{"payload file missing", "", []string{"--namespace", "billing", "--topic", "t", "--payload", "@/no/such/file"}, 2, "--payload @/no/such/file: no such file"},
		{"bad header flag", "", []string{"--namespace", "billing", "--topic", "t", "--payload", "{}", "--header", "novalue"}, 2, "--header wants NAME=VALUE"},
		{"bad available-at", "", []string{"--namespace", "billing", "--topic", "t", "--payload", "{}", "--available-at", "soon"}, 2, "--available-at must be an RFC 3339 time"},
		{"unknown flag", "", []string{"--tenant-id", "x"}, 2, "unknown flag: --tenant-id"},
		{"an argument", "", []string{"billing"}, 2, `outboxctl enqueue takes no arguments, got "billing"`},
	}
	for _, tc := range cases {
		r := cli(t, invocation{env: env.env, stdin: tc.stdin}, append([]string{"enqueue"}, tc.args...)...)
		r.wantError(t, tc.name, tc.code, tc.want)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending`); n != 0 {
		t.Errorf("bad input wrote %d messages", n)
	}
	cli(t, invocation{}, "enqueue", "--namespace", "a", "--topic", "b", "--payload", "{}").wantError(t, "no database", 2, "no database: set OUTBOX_DATABASE_URL")
}

func TestStatus(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	cli(t, env, "status").wantOK(t, "status of an empty outbox", "the outbox is empty")

	for i := range 3 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	enqueueMessages(t, d.Pool, outbox.Message{Namespace: "audit", Topic: "login", Payload: json.RawMessage(`{}`)})
	deadLetters(t, d, 2)

	r := cli(t, env, "status")
	r.wantOK(t, "status", "NAMESPACE", "OLDEST", "TOTAL", "2 dead letters: see why with outboxctl dead list")
	for _, row := range []string{"audit", "billing"} {
		if !strings.Contains(r.out, row) {
			t.Errorf("status lacks %s:\n%s", row, r.out)
		}
	}
	var doc statusDoc
	j := cli(t, env, "status", "--json")
	if err := json.Unmarshal([]byte(j.out), &doc); err != nil {
		t.Fatalf("status --json: %v\n%s", err, j.out)
	}
	// 3 usage messages, 2 of them dead; and the audit one.
	if doc.Totals.Pending != 2 || doc.Totals.Dead != 2 || len(doc.Topics) != 2 {
		t.Errorf("status --json totals %+v, %d topics", doc.Totals, len(doc.Topics))
	}

	// An open circuit breaker: its target, since when, why, next probe.
	if _, err := gate.NewStore(d.Pool).Record(context.Background(), "w", []gate.Outcome{{Target: "http:https://hooks.example/pay",
		Failures: 3, Threshold: 3, CoolDown: time.Minute, LastError: "TARGET_5XX: 503 Service Unavailable"}}); err != nil {
		t.Fatal(err)
	}
	r = cli(t, env, "status")
	r.wantOK(t, "status with an open breaker", "1 circuit breaker open", "http:https://hooks.example/pay",
		"TARGET_5XX: 503 Service Unavailable", "NEXT PROBE")
	j = cli(t, env, "status", "--json")
	doc = statusDoc{}
	if err := json.Unmarshal([]byte(j.out), &doc); err != nil || len(doc.OpenBreakers) != 1 ||
		doc.OpenBreakers[0].NextProbe.Before(doc.OpenBreakers[0].Since) {
		t.Fatalf("status --json open breakers: %v %+v", err, doc.OpenBreakers)
	}

	// --watch redraws until interrupted: interrupted once it has drawn
	// twice, or after a minute (a ceiling, which a passing run never
	// reaches, however slow the machine).
	watch := func(marker string, args ...string) result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out := &syncBuffer{}
		go func() {
			for strings.Count(out.String(), marker) < 2 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
		}()
		return cli(t, invocation{env: env.env, ctx: ctx, out: out}, args...)
	}
	watched := watch("outbox status at", "status", "--watch", "200ms")
	watched.wantOK(t, "status --watch 200ms, interrupted")
	if n := strings.Count(watched.out, "outbox status at"); n < 2 {
		t.Errorf("--watch drew %d times in a minute at 200ms", n)
	}
	lines := watch("\n", "status", "--watch=200ms", "--json")
	lines.wantOK(t, "status --watch --json")
	if n := strings.Count(lines.out, "\n"); n < 2 {
		t.Errorf("--watch --json printed %d lines in a minute at 200ms", n)
	}
	for _, l := range strings.Split(strings.TrimSpace(lines.out), "\n") {
		if err := json.Unmarshal([]byte(l), &doc); err != nil {
			t.Errorf("--watch --json line %q: %v", l, err)
		}
	}

	cli(t, env, "status", "--watch", "5ms").wantError(t, "--watch 5ms", 2, "--watch wants an interval of at least 100ms")
	cli(t, env, "status", "billing").wantError(t, "status billing", 2, `status takes no arguments, got "billing"`)
	cli(t, env, "status", "--jsn").wantError(t, "status --jsn", 2, "unknown flag: --jsn")
}

// deadLetters dead-letters n of the pending billing messages the way the
// dispatcher does: claimed, then completed as FAILED.
func deadLetters(t *testing.T, d *pgtest.DB, n int) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	store := lease.NewStore(d.Pool)
	msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "dispatch:test", BatchSize: n, Lease: time.Minute, Namespaces: []string{"billing"}})
	if err != nil || len(msgs) != n {
		t.Fatalf("claim %d: %v (%d)", n, err, len(msgs))
	}
	var results []lease.Result
	var ids []uuid.UUID
	for _, m := range msgs {
		results = append(results, lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeFailed,
			ErrorCode: "TARGET_REJECTED", ErrorMessage: "HTTP 422 Unprocessable Entity: unknown tenant " + m.TenantID,
			Target: "usage-webhook", TargetRef: "422", Latency: 12 * time.Millisecond})
		ids = append(ids, m.ID)
	}
	if _, err := store.CompleteBatch(ctx, "dispatch:test", results); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestDeadListAndShow(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	cli(t, env, "dead", "list").wantOK(t, "dead list, none", "no dead letters match")
	for i := range 3 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	ids := deadLetters(t, d, 2)

	list := cli(t, env, "dead", "list")
	list.wantOK(t, "dead list", "ID", "NAMESPACE/TOPIC", "billing/usage_snapshot", "TARGET_REJECTED", "HTTP 422 Unprocessable Entity: unknown tenant", ids[0].String(), ids[1].String())
	cli(t, env, "dead", "list", "--namespace", "payments").wantOK(t, "a filter matching nothing", "no dead letters match")
	cli(t, env, "dead", "list", "--error-code", "NO_ROUTE").wantOK(t, "another filter matching nothing", "no dead letters match")
	cli(t, env, "dead", "list", "--failed-after", "1h", "--topic", "usage_snapshot", "--limit", "1").
		wantOK(t, "dead list --limit 1", ids[0].String(), "showing the oldest 1 of 2 matching dead letters")
	cli(t, env, "dead", "list", "--failed-before", "2000-01-01").wantOK(t, "failed long ago", "no dead letters match")
	var page lease.DeadLetters
	j := cli(t, env, "dead", "list", "--json", "--id", ids[1].String())
	if err := json.Unmarshal([]byte(j.out), &page); err != nil || page.Matched != 1 || page.Letters[0].ID != ids[1] {
		t.Fatalf("dead list --json --id: %v %+v\n%s", err, page, j.out)
	}

	show := cli(t, env, "dead", "show", ids[0].String())
	show.wantOK(t, "dead show", "DEAD since", "billing/usage_snapshot", "dedupe key", "headers", "schema: usage/v1",
		"payload", `"tokens"`, "attempts (1, oldest first)", "FAILED", "dispatch:test", "usage-webhook", "12ms")
	var doc shownMessage
	sj := cli(t, env, "dead", "show", ids[0].String(), "--json")
	if err := json.Unmarshal([]byte(sj.out), &doc); err != nil || doc.Message == nil || doc.Message.State != "dead" || len(doc.Attempts) != 1 || doc.Attempts[0].State != "FAILED" {
		t.Fatalf("dead show --json: %v %+v", err, doc)
	}
	// A pending message can be shown too.
	var pendingID string
	if err := d.Pool.QueryRow(context.Background(), `SELECT id::text FROM outbox.pending`).Scan(&pendingID); err != nil {
		t.Fatal(err)
	}
	cli(t, env, "dead", "show", pendingID).wantOK(t, "show a pending message", "PENDING", "no attempts recorded")

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"dead"}, 2, "dead needs a subcommand: list, purge or show"},
		{[]string{"dead", "bury"}, 2, `unknown dead subcommand "bury"`},
		{[]string{"dead", "show"}, 2, "needs a message id"},
		{[]string{"dead", "show", "not-a-uuid"}, 2, `"not-a-uuid" is not a message id`},
		{[]string{"dead", "show", uuid.NewString()}, 1, "no message"},
		{[]string{"dead", "list", "--id", "nope"}, 2, `--id[0]: "nope" is not a message id`},
		{[]string{"dead", "list", "--namespace", "bad name"}, 2, `--namespace: "bad name" is not a namespace`},
		{[]string{"dead", "list", "--failed-after", "yesterday"}, 2, "--failed-after must be an RFC 3339 time"},
		{[]string{"dead", "list", "--failed-after", "1h", "--failed-before", "2h"}, 2, "--failed-after"},
		{[]string{"dead", "list", "--limit", "20000"}, 2, "--limit must be between 1 and 10000"},
		{[]string{"dead", "list", "--limt", "2"}, 2, "unknown flag: --limt"},
	} {
		cli(t, env, tc.args...).wantError(t, strings.Join(tc.args, " "), tc.code, tc.want)
	}
}

func TestReplay(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	for i := range 3 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	ids := deadLetters(t, d, 2)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no filter given: set --id, --namespace, --topic, --error-code, --failed-after or --failed-before, or --all"},
		{[]string{"--namespace", "billing", "--yes"}, "a replay that moves messages (--yes) needs a --reason"},
		{[]string{"--namespace", "billing", "--reason", "fixed"}, "--reason is recorded only when messages move"},
		{[]string{"--all", "--limit", "5000"}, "--limit must be between 1 and 1000"},
		{[]string{"--id", "x"}, `--id[0]: "x" is not a message id`},
		{[]string{"--topic", "usage snapshot"}, `--topic: "usage snapshot" is not a topic`},
		{[]string{"--failed-before", "tomorrow"}, "--failed-before must be an RFC 3339 time"},
		{[]string{"billing"}, "takes no arguments"},
		{[]string{"--dry-run"}, "unknown flag: --dry-run"},
	} {
		cli(t, env, append([]string{"replay"}, tc.args...)...).wantError(t, fmt.Sprint("replay ", tc.args), 2, tc.want)
	}

	cli(t, env, "replay", "--namespace", "payments").wantOK(t, "replay matching nothing", "no dead letters match")
	dry := cli(t, env, "replay", "--error-code", "TARGET_REJECTED")
	dry.wantOK(t, "replay dry run", "dry run: 2 dead letters would be replayed", ids[0].String(), ids[1].String())
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.dead`); n != 2 {
		t.Fatalf("the dry run moved messages: %d dead left", n)
	}
	var sum replayfn.Summary
	dj := cli(t, env, "replay", "--all", "--json")
	if err := json.Unmarshal([]byte(dj.out), &sum); err != nil || sum.Matched != 2 || !sum.DryRun || sum.Replayed != 0 {
		t.Fatalf("replay --all --json: %v %+v", err, sum)
	}

	moved := cli(t, env, "replay", "--id", ids[0].String(), "--yes", "--reason", "INC-7: endpoint fixed", "--operator", "alice@example.com")
	moved.wantOK(t, "replay --yes", "replayed 1 dead letter back to pending as alice@example.com (reason: INC-7: endpoint fixed)", ids[0].String())
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending WHERE id = $1 AND attempt_count = 0 AND lease_token IS NULL`, ids[0]); n != 1 {
		t.Errorf("the replayed message is not pending, due, with a fresh attempt count")
	}
	cli(t, env, "dead", "show", ids[0].String()).wantOK(t, "history after the replay", "PENDING", "REPLAYED", "alice@example.com", "reason: INC-7: endpoint fixed")
	cli(t, env, "replay", "--id", ids[0].String(), "--yes", "--reason", "again").wantOK(t, "replaying it again", "no dead letters match")

	// The operator defaults to the OS user.
	cli(t, env, "replay", "--all", "--yes", "--reason", "the rest").wantOK(t, "replay --all --yes", "replayed 1 dead letter back to pending as "+osUser())
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'REPLAYED'`); n != 2 {
		t.Errorf("%d REPLAYED attempts, want 2", n)
	}
}

func TestInvoke(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	snk, url := startSink(t, 0)
	for i := range 5 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	enqueueMessages(t, d.Pool, outbox.Message{Namespace: "billing", Topic: "usage_snapshot", Payload: json.RawMessage(`{"poison":true}`)})
	env := db(d.URL, "OUTBOX_ROUTES", routesTo(url), "SINK_SECRET", testSecret, "OUTBOX_LOG_LEVEL", "error")

	var sum dispatch.Summary
	r := cli(t, env, "invoke", "dispatch")
	if err := json.Unmarshal([]byte(lastJSON(r.out)), &sum); r.err != nil || err != nil {
		t.Fatalf("invoke dispatch: %v %v\n%s", r.err, err, r.out)
	}
	if sum.Claimed != 6 || sum.Delivered != 5 || sum.Dead != 1 || sum.StoppedBy != "drained" || snk.handledKeys() != 5 {
		t.Errorf("invoke dispatch answered %+v; the sink handled %d", sum, snk.handledKeys())
	}
	cli(t, env, "invoke", "reaper").wantOK(t, "invoke reaper", `"requeued": 0`, `"purged_attempts": 0`)
	cli(t, env, "invoke", "metrics").wantOK(t, "invoke metrics", `"totals"`, `"dead": 1`)

	eventFile := filepath.Join(t.TempDir(), "replay.json")
	if err := os.WriteFile(eventFile, []byte(`{"namespace":"billing","dry_run":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cli(t, env, "invoke", "dlq-replay", "--event", eventFile).wantOK(t, "invoke dlq-replay", `"matched": 1`, `"dry_run": true`)
	cli(t, invocation{env: env.env, stdin: `{"all":true}`}, "invoke", "dlq-replay", "--event", "-").wantOK(t, "invoke dlq-replay --event -", `"matched": 1`)
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.dead`); n != 1 {
		t.Errorf("a dry-run replay moved messages")
	}

	for _, tc := range []struct {
		inv  invocation
		args []string
		code int
		want string
	}{
		{env, []string{"invoke"}, 2, "invoke needs a function: dispatch, dlq-replay, metrics, migrate, reaper"},
		{env, []string{"invoke", "dispatcher"}, 2, `unknown function "dispatcher": did you mean dispatch?`},
		{env, []string{"invoke", "flush"}, 2, `unknown function "flush": use dispatch, dlq-replay, metrics, migrate, reaper`},
		{env, []string{"invoke", "dlq-replay"}, 2, "dlq-replay has no schedule event: pass --event FILE"},
		{env, []string{"invoke", "reaper", "--event", "/no/such.json"}, 2, "--event /no/such.json: no such file or directory"},
		{invocation{env: env.env, stdin: "{"}, []string{"invoke", "reaper", "--event", "-"}, 2, "--event - is not valid JSON"},
		{invocation{env: env.env, stdin: `{"limt":5}`}, []string{"invoke", "dlq-replay", "--event", "-"}, 2, `dlq-replay: malformed event: unknown field "limt"`},
		{invocation{env: env.env, stdin: `{}`}, []string{"invoke", "dlq-replay", "--event", "-"}, 2, "no filter given"},
		{env, []string{"invoke", "metrics", "--timeout", "0s"}, 2, "--timeout must be positive"},
		{db(d.URL, "OUTBOX_REAPER_BATCH_SIZE", "lots"), []string{"invoke", "reaper"}, 1, "reaper: cold start failed: OUTBOX_REAPER_BATCH_SIZE must be a whole number"},
		{db(d.URL), []string{"invoke", "dispatch"}, 1, "dispatch: cold start failed: route: no routes configured: set OUTBOX_ROUTES"},
	} {
		cli(t, tc.inv, tc.args...).wantError(t, strings.Join(tc.args, " "), tc.code, tc.want)
	}
}

// lastJSON is the JSON document at the end of an output that may start
// with log lines.
func lastJSON(out string) string {
	if i := strings.LastIndex(out, "\n{\n"); i >= 0 {
		return out[i+1:]
	}
	return out
}

func TestSinkCommand(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan result, 1)
	env := db(d.URL, "OUTBOX_SINK_SECRET", testSecret)
	inv := invocation{env: env.env, ctx: ctx}
	// The command's output, shared with the test while it runs.
	buf := &syncBuffer{}
	go func() {
		root := newRootCommandWithEnv(func(k string) string { return inv.env[k] })
		root.SetOut(buf)
		root.SetErr(buf)
		root.SetArgs([]string{"sink", "--listen", "127.0.0.1:0", "--reject-if", "poison=true", "--dedupe-table", "plugin_webhook_ids"})
		err := root.ExecuteContext(ctx)
		out <- result{out: buf.String(), err: err}
	}()
	var url string
	waitFor(t, time.Minute, "the sink's address", func() bool {
		_, rest, ok := strings.Cut(buf.String(), "sink listening on ")
		url, _, _ = strings.Cut(rest, " ")
		return ok && strings.HasSuffix(url, "/")
	})

	// The dispatch function delivers to it.
	for i := range 3 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	enqueueMessages(t, d.Pool, outbox.Message{Namespace: "billing", Topic: "usage_snapshot", DedupeKey: "bad-one", Payload: json.RawMessage(`{"poison":true}`)})
	dispatchEnv := db(d.URL, "OUTBOX_ROUTES", routesTo(url), "SINK_SECRET", testSecret, "OUTBOX_LOG_LEVEL", "error")
	cli(t, dispatchEnv, "invoke", "dispatch").wantOK(t, "dispatch to the sink", `"delivered": 3`, `"dead": 1`)

	// A redelivery (its answer was lost) is answered duplicate; a forged
	// one is refused.
	resp, err := postSigned(url, "tenant-0/turn-0", `{"id":"x","key":"tenant-0/turn-0","namespace":"billing","topic":"usage_snapshot","attempt":2,"created_at":"2026-11-21T10:00:00Z","payload":{"turn":0}}`, testSecret)
	if err != nil || resp != 200 {
		t.Errorf("a signed redelivery: %d %v, want 200", resp, err)
	}
	if resp, _ := postSigned(url, "k", `{"id":"y","key":"k","namespace":"billing","topic":"t","attempt":1,"created_at":"2026-11-21T10:00:00Z","payload":{}}`, "whsec_"+strings.Repeat("A", 32)); resp != 401 {
		t.Errorf("a forged request got %d, want 401", resp)
	}
	waitFor(t, time.Minute, "the sink's lines", func() bool { return strings.Count(buf.String(), "\n") >= 9 })
	cancel()
	r := <-out
	r.wantOK(t, "sink", "200 delivered", "key=tenant-1/turn-1 billing/usage_snapshot attempt=1",
		"422 rejected", "key=bad-one", "poison=true", "200 duplicate", "attempt=2", "401 rejected", "bad signature",
		"rejecting payloads with poison=true")
	if n := countRows(t, d.Pool, `SELECT count(*) FROM plugin_webhook_ids`); n != 3 {
		t.Errorf("%d webhook-ids recorded in the sink's table, want 3", n)
	}

	for _, tc := range []struct {
		inv  invocation
		args []string
		want string
	}{
		{db(d.URL), []string{"sink"}, "no signing secret: set OUTBOX_SINK_SECRET or pass --secret"},
		{db(d.URL), []string{"sink", "--secret", "whsec_!!!"}, "the signing secret is prefixed"},
		{env, []string{"sink", "--reject-if", "poison"}, "--reject-if wants FIELD=VALUE"},
		{env, []string{"sink", "--listen", "nowhere:99999"}, "--listen nowhere:99999"},
		{env, []string{"sink", "--delay", "-1s"}, "--delay must not be negative"},
		{env, []string{"sink", "--dedupe-table", "a.b.c"}, "want name or schema.name"},
		{invocation{env: map[string]string{"OUTBOX_SINK_SECRET": testSecret}}, []string{"sink"}, "no database"},
	} {
		cli(t, tc.inv, tc.args...).wantError(t, strings.Join(tc.args, " "), 2, tc.want)
	}
}

func TestServeBadInput(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL, "OUTBOX_ROUTES", routesTo("http://127.0.0.1:1/"), "SINK_SECRET", testSecret)
	for _, tc := range []struct {
		inv  invocation
		args []string
		code int
		want string
	}{
		{env, []string{"serve", "--poll-interval", "0s"}, 2, "--poll-interval must be at least 10ms"},
		{env, []string{"serve", "--debounce", "0s"}, 2, "--debounce must be positive"},
		{env, []string{"serve", "--reaper-interval", "-1m"}, 2, "--reaper-interval must not be negative"},
		{env, []string{"serve", "--batch-size", "-1"}, 2, "--batch-size must not be negative"},
		{env, []string{"serve", "--pool-interval", "1s"}, 2, "unknown flag: --pool-interval"},
		{env, []string{"serve", "now"}, 2, "takes no arguments"},
		{db(d.URL), []string{"serve"}, 1, "serve: cannot start: route: no routes configured"},
		{db(d.URL, "OUTBOX_ROUTES", routesTo("http://127.0.0.1:1/")), []string{"serve"}, 1, "SINK_SECRET"},
	} {
		cli(t, tc.inv, tc.args...).wantError(t, strings.Join(tc.args, " "), tc.code, tc.want)
	}
}

func TestUnknownCommand(t *testing.T) {
	t.Parallel()
	cli(t, invocation{}, "stat").wantError(t, "stat", 2, `unknown command "stat": did you mean status?`)
	cli(t, invocation{}, "frobnicate").wantError(t, "frobnicate", 2, `unknown command "frobnicate"`)
	cli(t, invocation{}).wantOK(t, "no command: the help", "outboxctl demo")
}

// A parked key shows in `blocked` with its dead head and what waits behind
// it; `discard` needs --yes and a reason, records both, and lets the key go.
func TestBlockedAndDiscard(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	ctx := context.Background()
	for i := range 3 {
		if _, err := outbox.Enqueue(ctx, d.Pool, outbox.Message{Namespace: "payments", Topic: "captured", OrderingKey: "acct-1",
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}); err != nil {
			t.Fatal(err)
		}
	}
	store := lease.NewStore(d.Pool)
	head, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
	if err != nil || len(head) != 1 {
		t.Fatalf("claim: %v %v", head, err)
	}
	if _, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: head[0].ID, LeaseToken: head[0].LeaseToken,
		Outcome: outboxtype.OutcomeFailed, ErrorCode: "TARGET_REJECTED", ErrorMessage: "HTTP 422: unknown card", OnDead: outboxtype.OnDeadPark}}); err != nil {
		t.Fatal(err)
	}

	cli(t, env, "blocked").wantOK(t, "blocked", "payments/acct-1", "parked", head[0].ID.String(), "TARGET_REJECTED", "unknown card")
	var keys []lease.BlockedKey
	out := cli(t, env, "blocked", "--json")
	if err := json.Unmarshal([]byte(out.out), &keys); err != nil || len(keys) != 1 || keys[0].Waiting != 2 {
		t.Fatalf("blocked --json: %s (%v)", out.out, err)
	}

	id := head[0].ID.String()
	cli(t, env, "discard", id).wantOK(t, "discard (dry run)", "dead payments/captured", "which waits for it", "dry run")
	cli(t, env, "discard", id, "--yes").wantError(t, "discard --yes without a reason", 2, "--yes needs a --reason")
	cli(t, env, "discard", "not-an-id").wantError(t, "discard a bad id", 2, `"not-an-id" is not a message id`)
	cli(t, env, "discard", id, "--yes", "--reason", "card replaced", "--operator", "ana").wantOK(t, "discard", "discarded "+id+" (dead) as ana: card replaced")
	var state, operator, reason string
	if err := d.Pool.QueryRow(ctx, `SELECT state, operator, reason FROM outbox.attempts WHERE message_id = $1 ORDER BY id DESC LIMIT 1`, id).Scan(&state, &operator, &reason); err != nil {
		t.Fatal(err)
	}
	if state != "DISCARDED" || operator != "ana" || reason != "card replaced" {
		t.Errorf("archive: %s by %s for %q", state, operator, reason)
	}
	cli(t, env, "blocked").wantOK(t, "blocked after the discard", "no blocked ordering keys")
	next, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
	if err != nil || len(next) != 1 || next[0].SequenceID != 2 {
		t.Fatalf("after the discard the key's next message is not claimable: %v %v", next, err)
	}
}

// enqueue holds messages to the database's outbox.limits, the authority
// every producer answers to: raised, a 300 KB payload read from a file
// (@FILE) is taken; lowered, a payload over it is refused before the
// database, naming the field, and nothing is written.
func TestEnqueueHoldsToTheDatabasesLimits(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	file := filepath.Join(t.TempDir(), "large.json")
	if err := os.WriteFile(file, []byte(`{"blob":"`+strings.Repeat("x", 300_000)+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"enqueue", "--namespace", "billing", "--topic", "export", "--payload", "@" + file}
	cli(t, env, args...).wantError(t, "300 KB under the default limit", 2, "payload is 300012 bytes as stored, over the limit of 262144")
	if _, err := d.Pool.Exec(context.Background(), `UPDATE outbox.limits SET max_payload_bytes = 1048576`); err != nil {
		t.Fatal(err)
	}
	cli(t, env, args...).wantOK(t, "300 KB under a limit of 1 MiB", "yes")
	if _, err := d.Pool.Exec(context.Background(), `UPDATE outbox.limits SET max_payload_bytes = 64, max_headers = 1`); err != nil {
		t.Fatal(err)
	}
	cli(t, env, "enqueue", "--namespace", "billing", "--topic", "export", "--payload", `{"tokens":1}`, "--header", "a=1", "--header", "b=2").
		wantError(t, "two headers under a limit of one", 2, "header has 2 entries, more than the limit of 1")
	r := cli(t, env, "enqueue", "--namespace", "billing", "--topic", "export", "--payload", `{"blob":"`+strings.Repeat("y", 100)+`"}`)
	r.wantError(t, "100 bytes under a limit of 64", 2, "payload is 112 bytes as stored, over the limit of 64")
	if r.err != nil && strings.Contains(r.err.Error(), "aborted") {
		t.Errorf("the database, not outboxctl, refused the payload: %v", r.err)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending`); n != 1 {
		t.Errorf("%d messages pending, want the one 300 KB payload", n)
	}
}

// dead show takes a prefix of an id, of 8 hex digits or more, that one
// message alone begins with; an ambiguous one lists the candidates, and a
// short one is refused.
func TestDeadShowTakesAUniquePrefix(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	enqueueMessages(t, d.Pool, usageMessage(1), usageMessage(2), usageMessage(3))
	ids := deadLetters(t, d, 3)
	// Ids made in one millisecond share their first 12 hex digits (a
	// UUIDv7's timestamp): give the three a common prefix and distinct
	// next digits, as messages of one busy minute have. (Their attempts,
	// append-only, stay under the old ids.)
	for i, id := range ids {
		renamed := uuid.MustParse(fmt.Sprintf("0193a3c4-5e6f-7%x%s", i, id.String()[16:]))
		if _, err := d.Pool.Exec(context.Background(), `UPDATE outbox.dead SET id = $2 WHERE id = $1`, id, renamed); err != nil {
			t.Fatal(err)
		}
		ids[i] = renamed
	}
	for _, prefix := range []string{ids[1].String()[:16], strings.ToUpper(ids[1].String()[:20]), strings.ReplaceAll(ids[1].String()[:16], "-", "")} {
		cli(t, env, "dead", "show", prefix).wantOK(t, "dead show "+prefix, "message "+ids[1].String()+"  DEAD")
	}
	amb := cli(t, env, "dead", "show", "0193a3c4")
	amb.wantError(t, "an ambiguous prefix", 2, "prefix 0193a3c4 is ambiguous: it matches 3 messages: "+ids[0].String()+", "+ids[1].String()+", "+ids[2].String())
	cli(t, env, "dead", "show", "0193a3").wantError(t, "a short prefix", 2, "give at least 8 hex digits")
	cli(t, env, "dead", "show", "ffffffff").wantError(t, "a prefix of nothing", 1, "no message id begins with ffffffff")
}
