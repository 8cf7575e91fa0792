package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// The dispatcher's purge leaves operators' actions in the archive; only an
// operator's purge_audit takes them, and the operator log keeps that it
// did. (The floors, an hour for purge and a day for purge_audit, and the
// dispatcher's lack of purge_audit, are in the privilege matrix:
// TestEveryMisuseOfAGrantedFunctionIsRefused.)
func TestDispatcherCannotEraseTheAuditTrail(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: "k", Payload: json.RawMessage(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
	if _, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: outboxtype.OutcomeFailed, ErrorCode: "X"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.ReplayDead(ctx, lease.ReplayRequest{MessageIDs: []uuid.UUID{msgs[0].ID}, Limit: 1, Reason: "fixed"}); err != nil {
		t.Fatal(err)
	}
	msgs, _ = store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
	if _, err := store.CompleteBatch(ctx, "w", dispatchedResults(msgs)); err != nil {
		t.Fatal(err)
	}

	dispatcher := pgtest.Connect(t, db.LoginAs(t, "outbox_dispatcher"))
	// Two days later, the dispatcher's purge takes the message's history
	// but not the replay.
	for _, stmt := range []string{
		`ALTER TABLE outbox.attempts DISABLE TRIGGER attempts_append_only`,
		`UPDATE outbox.attempts SET created_at = created_at - interval '2 days'`,
		`ALTER TABLE outbox.attempts ENABLE TRIGGER attempts_append_only`,
	} {
		if _, err := db.Pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dispatcher.Exec(ctx, `SELECT * FROM outbox.purge('1 hour', NULL, 1000)`); err != nil {
		t.Fatal(err)
	}
	var states []string
	rows, _ := db.Pool.Query(ctx, `SELECT state FROM outbox.attempts ORDER BY id`)
	for rows.Next() {
		var s string
		rows.Scan(&s)
		states = append(states, s)
	}
	if strings.Join(states, ",") != "REPLAYED" {
		t.Fatalf("after the dispatcher's purge the archive holds %v, want the REPLAYED audit row only", states)
	}
	operator := pgtest.Connect(t, db.LoginAs(t, "outbox_operator"))
	var n int64
	if err := operator.QueryRow(ctx, `SELECT outbox.purge_audit('1 day', 100, p_operator => 'oncall-ana', p_reason => 'retention policy')`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("an operator's purge of the audit trail: %d %v", n, err)
	}
	var login, details string
	operator.QueryRow(ctx, `SELECT session_user`).Scan(&login)
	if err := operator.QueryRow(ctx, `SELECT details::text FROM outbox.operator_log
		WHERE action = 'purge_audit' AND subject = 'outbox.attempts' AND operator = 'oncall-ana' AND db_user = $1 AND reason = 'retention policy'`,
		login).Scan(&details); err != nil {
		t.Fatalf("the purge of the audit trail is not in the operator log: %v", err)
	}
	if details != `{"purged": 1, "max_rows": 100, "older_than": "1 day"}` {
		t.Fatalf("the operator log says %s of the purge", details)
	}
}

// An operator action records the database login beside whatever operator
// name the caller gave.
func TestOperatorActionsRecordTheLogin(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
	if _, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: outboxtype.OutcomeFailed, ErrorCode: "X"}}); err != nil {
		t.Fatal(err)
	}
	operator := pgtest.Connect(t, db.LoginAs(t, "outbox_operator"))
	var login string
	operator.QueryRow(ctx, `SELECT session_user`).Scan(&login)
	if _, err := operator.Exec(ctx, `SELECT * FROM outbox.replay_dead(p_message_ids => $1, p_dry_run => false, p_operator => 'the-ceo', p_reason => 'trust me')`,
		[]uuid.UUID{msgs[0].ID}); err != nil {
		t.Fatal(err)
	}
	var name, user string
	if err := db.Pool.QueryRow(ctx, `SELECT operator, db_user FROM outbox.attempts WHERE state = 'REPLAYED'`).Scan(&name, &user); err != nil {
		t.Fatal(err)
	}
	if name != "the-ceo" || user != login {
		t.Fatalf("REPLAYED by %q as login %q, want the name given beside the login %q", name, user, login)
	}
}

// Who granted, took back or purged what stays in outbox.operator_log: the
// name the operator gave, the login that did it, the reason. A revoke
// deletes the grant's row, not the record of it. Nobody rewrites the log,
// not even its owner or a superuser; only the operator functions write it
// (that no runtime role may is in TestEveryForbiddenActIsDenied).
func TestOperatorLogRecordsNamespaceGrants(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	operator := pgtest.Connect(t, db.LoginAs(t, "outbox_operator"))
	var login string
	operator.QueryRow(ctx, `SELECT session_user`).Scan(&login)
	for _, stmt := range []string{
		`SELECT outbox.grant_namespace('outbox_producer', 'reporting', p_operator => 'ana', p_reason => 'new team')`,
		`SELECT outbox.grant_namespace('outbox_producer', 'reporting')`,
		`SELECT outbox.revoke_namespace('outbox_producer', 'reporting', p_operator => 'ben', p_reason => 'team gone')`,
		`SELECT outbox.revoke_namespace('outbox_producer', 'reporting', p_operator => 'ben')`,
	} {
		if _, err := operator.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	reader := pgtest.Connect(t, db.LoginAs(t, "outbox_reader"))
	rows, err := reader.Query(ctx, `SELECT action, subject, coalesce(operator, '-'), db_user = $1, coalesce(reason, '-'),
			details - 'granted_at' - 'granted_by', coalesce(details ? 'granted_at' AND details->>'granted_by' = $1, false)
		FROM outbox.operator_log ORDER BY id`, login)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var action, subject, name, reason string
		var byLogin, grantRecalled bool
		var details map[string]any
		if err := rows.Scan(&action, &subject, &name, &byLogin, &reason, &details, &grantRecalled); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s by %s (login %v) for %s: %v, grant recalled %v", action, subject, name, byLogin, reason, details, grantRecalled))
	}
	want := []string{
		"grant_namespace outbox_producer by ana (login true) for new team: map[namespace:reporting new:true], grant recalled false",
		"grant_namespace outbox_producer by - (login true) for -: map[namespace:reporting new:false], grant recalled false",
		"revoke_namespace outbox_producer by ben (login true) for team gone: map[existed:true namespace:reporting], grant recalled true",
		"revoke_namespace outbox_producer by ben (login true) for -: map[existed:false namespace:reporting], grant recalled false",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the operator log holds\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	// Append-only for everyone, the superuser and the owner included.
	for _, as := range []string{"", "SET ROLE outbox_owner; "} {
		for _, stmt := range []string{
			`UPDATE outbox.operator_log SET operator = 'someone else'`,
			`DELETE FROM outbox.operator_log`,
			`TRUNCATE outbox.operator_log`,
		} {
			conn := pgtest.Connect(t, db.URL)
			_, err := conn.Exec(ctx, as+stmt)
			if sqlstate(err) != "P0001" || !strings.Contains(err.Error(), "append-only") {
				t.Errorf("%s%s: %v, want P0001 append-only", as, stmt, err)
			}
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox.operator_log`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("the log holds %d rows after the attempts to rewrite it (%v), want 4", n, err)
	}
}
