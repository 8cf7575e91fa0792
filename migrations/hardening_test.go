package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/dispatcher/migrations"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/pgtest"
)

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// A producer confined to its namespace cannot enqueue into another's, so it
// can neither squat the other team's dedupe keys (and have its forged
// payload delivered in their place) nor hold the other team's ordering
// keys; in its own namespace it works as before.
func TestProducerConfinedToItsNamespaces(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	intruder := pgtest.Connect(t, db.LoginAs(t, "outbox_producer"))
	var login string
	if err := intruder.QueryRow(ctx, `SELECT current_user`).Scan(&login); err != nil {
		t.Fatal(err)
	}
	operator := pgtest.Connect(t, db.LoginAs(t, "outbox_operator"))
	if _, err := operator.Exec(ctx, `SELECT outbox.grant_namespace($1, 'reporting')`, login); err != nil {
		t.Fatalf("an operator grants a namespace: %v", err)
	}

	for what, sql := range map[string]string{
		"squat a dedupe key":    `SELECT * FROM outbox.enqueue('payments', 'captured', '{"amount": 1000000}', p_dedupe_key => 'pay-77')`,
		"block an ordering key": `SELECT * FROM outbox.enqueue('payments', 'captured', '{"x": 1}', p_ordering_key => 'acct-9', p_available_at => now() + interval '300 days')`,
		"enqueue a batch":       `SELECT * FROM outbox.enqueue_batch(ARRAY['reporting', 'payments'], ARRAY['t', 't'], ARRAY['{"a":1}', '{"a":2}'])`,
	} {
		_, err := intruder.Exec(ctx, sql)
		if sqlstate(err) != insufficientPrivilege || !strings.Contains(err.Error(), `namespace 'payments'`) {
			t.Errorf("%s in another team's namespace: %v, want 42501 naming the namespace", what, err)
		}
	}
	if _, err := intruder.Exec(ctx, `SELECT * FROM outbox.enqueue('reporting', 'daily', '{"rows": 3}', p_dedupe_key => 'pay-77')`); err != nil {
		t.Fatalf("enqueue into its own namespace: %v", err)
	}

	// The payments team's own producer (not confined) is unaffected.
	payments := lease.NewStore(db.Pool)
	res, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "payments", Topic: "captured", DedupeKey: "pay-77",
		OrderingKey: "acct-9", Payload: json.RawMessage(`{"amount": 12}`)})
	if err != nil || !res.Inserted || res.SequenceID != 1 {
		t.Fatalf("the owner of the namespace: %+v %v, want its own message, first of its key", res, err)
	}
	claimed, err := payments.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var pay int
	for _, m := range claimed {
		if m.Namespace == "payments" {
			pay++
			if string(m.Payload) != `{"amount": 12}` {
				t.Errorf("payments delivers %s", m.Payload)
			}
		}
	}
	if pay != 1 {
		t.Fatalf("%d payments messages claimable, want its own one", pay)
	}

	// Revoked, the login is no longer confined.
	if _, err := operator.Exec(ctx, `SELECT outbox.revoke_namespace($1, 'reporting')`, login); err != nil {
		t.Fatal(err)
	}
	if _, err := intruder.Exec(ctx, `SELECT * FROM outbox.enqueue('payments', 'refunded', '{"x": 1}')`); err != nil {
		t.Fatalf("after the revoke: %v", err)
	}
}

// The dispatcher's purge cannot shorten retention below an hour, nor erase
// operators' actions from the archive; only an operator can, after a day.
func TestDispatcherCannotEraseTheAuditTrail(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: "k", Payload: json.RawMessage(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	msgs, _ := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
	if _, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: lease.Failed, ErrorCode: "X"}}); err != nil {
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
	_, err := dispatcher.Exec(ctx, `SELECT * FROM outbox.purge('0 seconds', '0 seconds', 1000000)`)
	if sqlstate(err) != "22023" || !strings.Contains(err.Error(), "at least 1 hour") {
		t.Fatalf("the dispatcher purging everything: %v, want refused", err)
	}
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
	if _, err := dispatcher.Exec(ctx, `SELECT outbox.purge_audit('1 day', 100)`); sqlstate(err) != insufficientPrivilege {
		t.Fatalf("the dispatcher erasing the audit trail: %v, want permission denied", err)
	}
	operator := pgtest.Connect(t, db.LoginAs(t, "outbox_operator"))
	if _, err := operator.Exec(ctx, `SELECT outbox.purge_audit('1 hour', 100)`); sqlstate(err) != "22023" {
		t.Fatalf("an operator's purge of the audit trail under a day: %v, want refused", err)
	}
	var n int64
	if err := operator.QueryRow(ctx, `SELECT outbox.purge_audit('1 day', 100)`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("an operator's purge of the audit trail: %d %v", n, err)
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
	if _, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: lease.Failed, ErrorCode: "X"}}); err != nil {
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

// The schema and its functions belong to outbox_owner, not to the
// superuser that migrated, and a function the owner creates later is not
// executable by PUBLIC.
func TestSchemaBelongsToTheOutboxOwner(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	var notOwned int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'outbox' AND p.proowner <> 'outbox_owner'::regrole`).Scan(&notOwned); err != nil || notOwned != 0 {
		t.Fatalf("%d outbox functions not owned by outbox_owner (%v)", notOwned, err)
	}
	var super bool
	if err := db.Pool.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = 'outbox_owner'`).Scan(&super); err != nil || super {
		t.Fatalf("outbox_owner is a superuser (%v)", err)
	}
	// A later migration's function, created as the owner.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`SET LOCAL ROLE outbox_owner`,
		`CREATE FUNCTION outbox.added_later() RETURNS int LANGUAGE sql SECURITY DEFINER AS 'SELECT 1'`,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var public bool
	if err := db.Pool.QueryRow(ctx, `SELECT has_function_privilege('public', 'outbox.added_later()', 'EXECUTE')`).Scan(&public); err != nil || public {
		t.Fatalf("PUBLIC may execute a function added later (%v)", err)
	}
	reader := pgtest.Connect(t, db.LoginAs(t, "outbox_reader"))
	if _, err := reader.Exec(ctx, `SELECT outbox.added_later()`); sqlstate(err) != insufficientPrivilege {
		t.Fatalf("a reader calling a function added later: %v, want permission denied", err)
	}
}

// Upgrading keeps every dedupe window: a key whose message left no trace
// (pending, dead or an outcome in the archive) takes its enqueue time as its
// outcome's, the time its window was counted from before; the others keep
// reading theirs from where it is.
func TestUpgradeDatesKeysWhoseArchiveIsGone(t *testing.T) {
	t.Parallel()
	url := pgtest.NewEmpty(t)
	ctx := context.Background()
	m, err := migrations.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.DownTo(ctx, 4); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, url)
	delivered, gone, waiting := uuid.New(), uuid.New(), uuid.New()
	for _, stmt := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO outbox.dedupe (namespace, topic, dedupe_key, message_id, created_at) VALUES
			('billing', 'charge', 'delivered', $1, now() - interval '10 days'),
			('billing', 'charge', 'gone', $2, now() - interval '10 days'),
			('billing', 'charge', 'waiting', $3, now() - interval '10 days')`, []any{delivered, gone, waiting}},
		{`INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic, dedupe_key, created_at)
			VALUES ($1, 1, 'DISPATCHED', 'billing', 'charge', 'delivered', now() - interval '1 day')`, []any{delivered}},
		{`INSERT INTO outbox.pending (id, namespace, topic, dedupe_key, payload, created_at)
			VALUES ($1, 'billing', 'charge', 'waiting', '{}', now() - interval '10 days')`, []any{waiting}},
	} {
		if _, err := conn.Exec(ctx, stmt.sql, stmt.args...); err != nil {
			t.Fatalf("%s: %v", stmt.sql, err)
		}
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	var dated []string
	rows, err := conn.Query(ctx, `SELECT dedupe_key FROM outbox.dedupe WHERE settled_at = created_at ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		rows.Scan(&k)
		dated = append(dated, k)
	}
	if strings.Join(dated, ",") != "gone" {
		t.Fatalf("keys dated by their enqueue: %v, want only the one whose message left no trace", dated)
	}
	var purged int64
	if err := conn.QueryRow(ctx, `SELECT purged_dedupe FROM outbox.purge(NULL, '7 days', 100)`).Scan(&purged); err != nil || purged != 1 {
		t.Fatalf("a week's dedupe purge after the upgrade took %d keys (%v), want the one whose message left no trace", purged, err)
	}
}
