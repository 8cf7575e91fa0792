package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// retryLater claims the due billing messages and completes them RETRYABLE
// with TARGET_5XX, their next attempt an hour away, as the dispatcher does
// when the target fails.
func retryLater(t *testing.T, d *pgtest.DB) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	store := lease.NewStore(d.Pool)
	msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "dispatch:test", BatchSize: 100, Lease: time.Minute, Namespaces: []string{"billing"}})
	if err != nil {
		t.Fatal(err)
	}
	var results []lease.Result
	var ids []uuid.UUID
	for _, m := range msgs {
		results = append(results, lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeRetryable,
			ErrorCode: "TARGET_5XX", ErrorMessage: "HTTP 503 Service Unavailable: " + strings.Repeat("upstream overloaded; ", 10),
			RetryAt: time.Now().Add(time.Hour)})
		ids = append(ids, m.ID)
	}
	if _, err := store.CompleteBatch(ctx, "dispatch:test", results); err != nil {
		t.Fatal(err)
	}
	return ids
}

func orderedPayment(i int) outbox.Message {
	return outbox.Message{Namespace: "payments", Topic: "captured", OrderingKey: "acct-42", Payload: json.RawMessage(`{"amount":1}`)}
}

func TestPendingList(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	cli(t, env, "pending", "list").wantOK(t, "pending list of an empty outbox", "no pending messages match")

	enqueueMessages(t, d.Pool, usageMessage(1), usageMessage(2))
	failing := retryLater(t, d)
	enqueueMessages(t, d.Pool, orderedPayment(1), orderedPayment(2), orderedPayment(3))
	store := lease.NewStore(d.Pool)
	head, err := store.ClaimBatch(context.Background(), lease.ClaimParams{WorkerID: "dispatch:test", BatchSize: 10, Lease: time.Minute, Namespaces: []string{"payments"}})
	if err != nil || len(head) != 1 {
		t.Fatalf("claim the key's head: %v (%d)", err, len(head))
	}

	all := cli(t, env, "pending", "list")
	all.wantOK(t, "pending list", "ID", "NAMESPACE/TOPIC", "KEY/SEQ", "STATE", "WAITS BEHIND",
		failing[0].String(), "billing/usage_snapshot", "retrying", "TARGET_5XX", "HTTP 503 Service Unavailable", "…", "in 59m",
		"acct-42/1", "leased", "held by dispatch:test, lease ends in", "acct-42/2", "behind", head[0].ID.String()+" (seq 1, leased)")

	var page lease.PendingMessages
	j := cli(t, env, "pending", "list", "--retrying", "--json")
	if err := json.Unmarshal([]byte(j.out), &page); err != nil || page.Matched != 2 || len(page.Messages) != 2 {
		t.Fatalf("pending list --retrying --json: %v %+v\n%s", err, page, j.out)
	}
	if m := page.Messages[0]; !strings.HasSuffix(m.LastError, "upstream overloaded; ") || m.State != lease.PendingRetrying || m.AttemptCount != 1 {
		t.Errorf("--json has %+v, want the whole error", m)
	}
	behind := cli(t, env, "pending", "list", "--namespace", "payments", "--ordering-key", "acct-42", "--json")
	if err := json.Unmarshal([]byte(behind.out), &page); err != nil || len(page.Messages) != 3 {
		t.Fatalf("pending list --ordering-key --json: %v\n%s", err, behind.out)
	}
	if w := page.Messages[2].WaitsBehind; w == nil || w.ID == nil || *w.ID != head[0].ID || w.SequenceID != 1 || w.State != lease.PendingLeased {
		t.Errorf("sequence 3 waits behind %+v, want the leased head", w)
	}
	cli(t, env, "pending", "list", "--older-than", "1d").wantOK(t, "nothing a day old", "no pending messages match")
	cli(t, env, "pending", "list", "--limit", "1").wantOK(t, "pending list --limit 1", "1 of 5 matching messages shown")
	cli(t, env, "pending", "list", "--topic", "captured", "--id", head[0].ID.String()).wantOK(t, "by id", head[0].ID.String())

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pending"}, "pending needs a subcommand: list"},
		{[]string{"pending", "show"}, `unknown pending subcommand "show"`},
		{[]string{"pending", "list", "--older-than", "soon"}, "--older-than wants a duration such as 90s, 10m, 2h or 3d"},
		{[]string{"pending", "list", "--limit", "0"}, "--limit must be between 1 and 10000"},
		{[]string{"pending", "list", "--ordering-key", "acct-42"}, "--ordering-key needs --namespace"},
		{[]string{"pending", "list", "--id", "x"}, `--id: "x" is not a message id`},
		{[]string{"pending", "list", "billing"}, "takes no arguments"},
	} {
		cli(t, env, tc.args...).wantError(t, strings.Join(tc.args, " "), 2, tc.want)
	}
}

func TestRetry(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	enqueueMessages(t, d.Pool, usageMessage(1), usageMessage(2))
	failing := retryLater(t, d)
	enqueueMessages(t, d.Pool, usageMessage(3))
	dead := deadLetters(t, d, 1)[0]

	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "retry needs the ids of the messages to retry"},
		{[]string{"nope"}, `"nope" is not a message id`},
		{[]string{failing[0].String(), "--yes"}, "--yes needs a --reason"},
		{[]string{failing[0].String(), "--reason", "fixed"}, "--reason is recorded only when something changes"},
	} {
		cli(t, env, append([]string{"retry"}, tc.args...)...).wantError(t, strings.Join(tc.args, " "), 2, tc.want)
	}

	// A dry run says what the call would do, as the database decides it,
	// and exits as the call would: 0 when it would retry, 1 when --yes
	// would be refused, in the database's words without the layers'
	// prefixes.
	dry := cli(t, env, "retry", failing[0].String())
	dry.wantOK(t, "retry dry run", failing[0].String()+": billing/usage_snapshot, retrying (TARGET_5XX), next attempt in ", "s: would retry now",
		"dry run: nothing changed; add --yes")
	refused := cli(t, env, "retry", failing[0].String(), dead.String())
	refused.wantError(t, "retry dry run of a dead letter", 1, "retry would be refused, nothing would change: ")
	for _, want := range []string{dead.String(), "dead letter"} {
		if !strings.Contains(oneLine(refused.err), want) {
			t.Errorf("the dry run's refusal %q does not name %q", oneLine(refused.err), want)
		}
	}
	if !strings.Contains(refused.out, dead.String()+": not pending") || strings.Contains(refused.out, "would retry now") {
		t.Errorf("the refused dry run lists:\n%s", refused.out)
	}
	real := cli(t, env, "retry", failing[0].String(), dead.String(), "--yes", "--reason", "target fixed")
	real.wantError(t, "retry a dead letter", 1, "retry refused: ")
	for _, internal := range []string{"lease:", "outbox.retry_now", "SQLSTATE", "ERROR:"} {
		if strings.Contains(oneLine(real.err), internal) || strings.Contains(oneLine(refused.err), internal) {
			t.Errorf("the refusal shows %q: %q / %q", internal, oneLine(real.err), oneLine(refused.err))
		}
	}
	if !strings.Contains(oneLine(real.err), dead.String()) {
		t.Errorf("the refusal %q does not name the dead letter", oneLine(real.err))
	}
	var doc refusedJSON
	asJSON := cli(t, env, "retry", failing[0].String(), dead.String(), "--json")
	if err := json.Unmarshal([]byte(asJSON.out), &doc); err != nil || !doc.Refused || !doc.DryRun || doc.SQLState != "P7005" || asJSON.code != 1 {
		t.Errorf("retry --json of a dead letter: exit %d, %+v (%v) from %q, want a dry run's refusal with SQLSTATE P7005", asJSON.code, doc, err, asJSON.out)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'RESCHEDULED'`); n != 0 {
		t.Fatalf("dry runs and a refused retry recorded %d RESCHEDULED attempts", n)
	}

	done := cli(t, env, "retry", failing[0].String(), failing[1].String(), "--yes", "--reason", "INC-7: target fixed", "--operator", "alice@example.com")
	done.wantOK(t, "retry --yes", "retrying "+failing[0].String()+" now", "as alice@example.com: INC-7: target fixed")
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending WHERE id = ANY($1) AND next_attempt_at <= now() AND attempt_count = 1`, failing); n != 2 {
		t.Errorf("%d of 2 retried messages are due now with their attempt count kept", n)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'RESCHEDULED' AND operator = 'alice@example.com'
		AND reason = 'INC-7: target fixed' AND db_user = session_user AND message_id = ANY($1)`, failing); n != 2 {
		t.Errorf("%d RESCHEDULED attempts with operator, login and reason, want 2", n)
	}
	cli(t, env, "dead", "show", failing[0].String()).wantOK(t, "the history shows it", "RESCHEDULED", "alice@example.com", "reason: INC-7: target fixed")
}

func ids(t *testing.T, d *pgtest.DB, sql string) []uuid.UUID {
	t.Helper()
	rows, err := d.Pool.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	return out
}

func TestDeadPurge(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	for i := range 3 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	old := deadLetters(t, d, 2)
	if _, err := d.Pool.Exec(context.Background(), `UPDATE outbox.dead SET failed_at = now() - interval '40 days'`); err != nil {
		t.Fatal(err)
	}
	young := deadLetters(t, d, 1)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "dead purge needs --older-than"},
		{[]string{"--older-than", "12h"}, "--older-than must be at least 1d"},
		{[]string{"--older-than", "a month"}, "--older-than wants a duration"},
		{[]string{"--older-than", "30d", "--yes"}, "--yes needs a --reason"},
		{[]string{"--older-than", "30d", "--limit", "0"}, "--limit must be between 1 and 10000"},
	} {
		cli(t, env, append([]string{"dead", "purge"}, tc.args...)...).wantError(t, strings.Join(tc.args, " "), 2, tc.want)
	}

	dry := cli(t, env, "dead", "purge", "--older-than", "30d")
	dry.wantOK(t, "dead purge dry run", "dry run: 2 dead letters failed more than 30d ago; 2 would be purged", old[0].String(), old[1].String())
	if strings.Contains(dry.out, young[0].String()) {
		t.Errorf("the dry run lists the young letter:\n%s", dry.out)
	}
	cli(t, env, "dead", "purge", "--older-than", "30d", "--limit", "1", "--yes", "--reason", "30-day retention", "--operator", "ana").
		wantOK(t, "dead purge --limit 1", "purged 1 dead letter older than 30d, as ana: 30-day retention", "1 older dead letter remain")
	var res lease.PurgedDead
	j := cli(t, env, "dead", "purge", "--older-than", "30d", "--yes", "--reason", "30-day retention", "--operator", "ana", "--json")
	if err := json.Unmarshal([]byte(j.out), &res); err != nil || res.Purged != 1 || res.Remaining != 0 {
		t.Fatalf("dead purge --json: %v %+v\n%s", err, res, j.out)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.dead`); n != 1 {
		t.Errorf("%d dead letters left, want the young one", n)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISCARDED' AND operator = 'ana'
		AND reason = '30-day retention' AND db_user = session_user AND message_id = ANY($1)`, old); n != 2 {
		t.Errorf("%d of the purged letters audited as DISCARDED, want 2", n)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.operator_log WHERE action = 'purge_dead' AND operator = 'ana'`); n != 2 {
		t.Errorf("%d purges in the operator log, want 2", n)
	}
}

func TestPauseResumeAndStatus(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	for i := range 3 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	retryLater(t, d)
	enqueueMessages(t, d.Pool, outbox.Message{Namespace: "audit", Topic: "login", Payload: json.RawMessage(`{}`)},
		outbox.Message{Namespace: "audit", Topic: "export", Payload: json.RawMessage(`{}`)})

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pause", "--reason", "x"}, "pause needs --namespace"},
		{[]string{"pause", "--namespace", "audit"}, "pause needs a --reason"},
		{[]string{"resume", "--namespace", "audit"}, "resume needs a --reason"},
		{[]string{"pause", "audit"}, "takes no arguments"},
	} {
		cli(t, env, tc.args...).wantError(t, strings.Join(tc.args, " "), 2, tc.want)
	}

	cli(t, env, "pause", "--namespace", "audit", "--topic", "login", "--reason", "INC-9: SIEM down", "--operator", "ana").
		wantOK(t, "pause a topic", "paused audit/login (1 pending message) as ana: INC-9: SIEM down",
			"resume with: outboxctl resume --namespace audit --topic login")
	cli(t, env, "pause", "--namespace", "audit", "--topic", "login", "--reason", "again").
		wantError(t, "pause it twice", 1, "audit/login is already paused, by ana")
	cli(t, env, "pause", "--namespace", "bad name", "--reason", "x").wantError(t, "pause a bad namespace", 1, `'bad name' is not a namespace`)

	st := cli(t, env, "status")
	st.wantOK(t, "status with a pause", "RETRYING", "BLOCKED", "PAUSED", "TOP ERROR", "TARGET_5XX ×3",
		"1 pause in force", "audit/login", "ana", "INC-9: SIEM down",
		"3 messages retrying: see their errors with outboxctl pending list --retrying")
	var doc statusDoc
	if err := json.Unmarshal([]byte(cli(t, env, "status", "--json").out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Totals.Paused != 1 || doc.Totals.Retrying != 3 || doc.Totals.Due != 1 || len(doc.Pauses) != 1 ||
		doc.Pauses[0].PausedBy != "ana" || doc.Pauses[0].Reason != "INC-9: SIEM down" || doc.Pauses[0].Messages != 1 {
		t.Errorf("status --json: totals %+v, pauses %+v", doc.Totals, doc.Pauses)
	}
	for _, s := range doc.Topics {
		if s.Namespace == "billing" && (s.TopErrorCode != "TARGET_5XX" || s.TopErrorCount != 3) {
			t.Errorf("billing's top error is %q ×%d", s.TopErrorCode, s.TopErrorCount)
		}
	}
	cli(t, env, "pending", "list", "--namespace", "audit").wantOK(t, "the paused message listed", "audit/login", "paused", "audit/export", "due")

	cli(t, env, "resume", "--namespace", "audit", "--reason", "x").wantError(t, "resume the namespace", 1, "audit/* is not paused; paused there: audit/login")
	var res pauseResult
	r := cli(t, env, "resume", "--namespace", "audit", "--topic", "login", "--reason", "SIEM back", "--operator", "bo", "--json")
	if err := json.Unmarshal([]byte(r.out), &res); err != nil || res.Messages != 1 || res.Paused || res.Topic != "login" {
		t.Fatalf("resume --json: %v %+v\n%s", err, res, r.out)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.operator_log WHERE (action, subject, operator, reason) IN
		(('pause', 'audit/login', 'ana', 'INC-9: SIEM down'), ('resume', 'audit/login', 'bo', 'SIEM back')) AND db_user = session_user`); n != 2 {
		t.Errorf("%d of the pause and resume in the operator log", n)
	}
	if strings.Contains(cli(t, env, "status").out, "pause in force") {
		t.Error("status still shows a pause after the resume")
	}
}

// The console works as the roles the README grants: an operator login runs
// every command and is recorded as itself; a reader lists but may not act.
func TestConsoleAsOperatorAndReader(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	enqueueMessages(t, d.Pool, usageMessage(1), usageMessage(2))
	failing := retryLater(t, d)
	operator := db(d.LoginAs(t, "outbox_operator"))
	reader := db(d.LoginAs(t, "outbox_reader"))

	cli(t, operator, "status").wantOK(t, "status as operator", "TARGET_5XX ×2")
	cli(t, operator, "pending", "list", "--retrying").wantOK(t, "pending list as operator", failing[0].String())
	cli(t, operator, "pause", "--namespace", "billing", "--reason", "hold", "--operator", "ana").wantOK(t, "pause as operator", "paused namespace billing (2 pending messages)")
	cli(t, operator, "retry", failing[0].String(), "--yes", "--reason", "fixed").wantOK(t, "retry as operator", "retrying "+failing[0].String())
	cli(t, operator, "dead", "purge", "--older-than", "30d", "--yes", "--reason", "retention").wantOK(t, "dead purge as operator", "purged 0 dead letters")
	cli(t, reader, "status").wantOK(t, "status as reader", "1 pause in force", "ana")
	cli(t, reader, "pending", "list").wantOK(t, "pending list as reader", "paused")
	cli(t, reader, "resume", "--namespace", "billing", "--reason", "x").wantError(t, "resume as reader", 1, "permission denied for function resume")
	cli(t, reader, "retry", failing[1].String(), "--yes", "--reason", "x").wantError(t, "retry as reader", 1, "permission denied for function retry_now")
	cli(t, operator, "resume", "--namespace", "billing", "--reason", "back").wantOK(t, "resume as operator", "resumed namespace billing (2 pending messages")

	var login string
	if err := d.Pool.QueryRow(context.Background(), `SELECT db_user FROM outbox.attempts WHERE state = 'RESCHEDULED'`).Scan(&login); err != nil || !strings.HasPrefix(login, "outbox_t_login_") {
		t.Errorf("the retry was recorded as login %q (%v), want the operator's login", login, err)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.operator_log WHERE action IN ('pause', 'resume', 'purge_dead') AND db_user LIKE 'outbox\_t\_login\_%'`); n != 3 {
		t.Errorf("%d of the operator's 3 logged actions recorded under its own login", n)
	}
}

// A pause of a namespace or topic that nothing names — no message, no
// pause, no route — is a likely typo that would hold nothing while the
// real one flows: refused with the nearest names, unless --force. A route
// naming the namespace makes it known, and so does a pause in force.
func TestPauseOfAnUnknownNameIsRefused(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	enqueueMessages(t, d.Pool, usageMessage(1))

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--namespace", "billingg"}, `namespace "billingg" is unknown: no pending or dead messages, no pause and no route name it (did you mean --namespace billing?); --force pauses it anyway`},
		{[]string{"--namespace", "ledger"}, `namespace "ledger" is unknown`},
		{[]string{"--namespace", "billing", "--topic", "usage_snapshots"}, `topic "usage_snapshots" of namespace billing is unknown: no pending or dead messages, no pause and no route name it (did you mean --topic usage_snapshot?)`},
	} {
		args := append([]string{"pause", "--reason", "INC-1"}, tc.args...)
		cli(t, env, args...).wantError(t, strings.Join(args, " "), 2, tc.want)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.paused`); n != 0 {
		t.Fatalf("%d pauses after refusals", n)
	}

	cli(t, env, "pause", "--namespace", "ledger", "--reason", "before its producers start", "--force").
		wantOK(t, "pause --force", "paused namespace ledger (0 pending messages)")
	// Paused, the namespace is known: resuming and pausing again need no force.
	cli(t, env, "resume", "--namespace", "ledger", "--reason", "x").wantOK(t, "resume ledger", "resumed namespace ledger")
	// A route naming a namespace makes it known, messages or not.
	routed := db(d.URL, "OUTBOX_ROUTES", `{"routes":[{"match":{"namespace":"payments","topic":"*"},"target":{"type":"http","url":"https://example.com/hook","signing_secret_env":"HOOK_SECRET"}}]}`,
		"HOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	cli(t, routed, "pause", "--namespace", "payments", "--reason", "x").wantOK(t, "pause a routed namespace", "paused namespace payments")
	cli(t, env, "pause", "--namespace", "billing", "--topic", "usage_snapshot", "--reason", "x").wantOK(t, "pause a known topic", "paused billing/usage_snapshot (1 pending message)")
}
