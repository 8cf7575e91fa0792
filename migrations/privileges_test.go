package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// Least privilege, proven from the outside: each runtime role logs in
// through a user granted only that role and tries everything it must not
// do — every direct write on every table and sequence of schema outbox,
// every function it was not granted (enumerated from the catalog, so a
// function added by a later migration is covered without editing this
// file), and every change to the schema itself. Nothing may succeed, and
// the refusal must be PostgreSQL's, SQLSTATE 42501, before any row is read.
//
// The matrix has two halves:
//
//   - TestEveryForbiddenActIsDenied: what no grant allows, role by role,
//     from the catalog; a function the owner creates later (as a later
//     migration would) is among those walked, and PUBLIC holds nothing.
//     Reading another team's dedupe or ordering keys is here: no runtime
//     role may read outbox.dedupe or outbox.sequences.
//   - TestEveryMisuseOfAGrantedFunctionIsRefused: what a granted function
//     refuses for its arguments — a producer confined to one namespace
//     enqueueing into, squatting the dedupe keys of or blocking the
//     ordering keys of another; the dispatcher purging below the floor or
//     erasing operators' actions.
//
// What the permitted side does is in ownership_test.go and
// namespace_grants_test.go (the owner of a namespace unaffected, a revoked
// producer confined to nothing until the confinement is lifted) and
// audit_test.go (what a purge at the floor keeps, what the operator log
// records).

var runtimeRoles = []string{"outbox_producer", "outbox_dispatcher", "outbox_operator", "outbox_reader"}

// grantedFunctions are the functions each role may execute, by name; every
// other function of schema outbox is denied to it.
var grantedFunctions = map[string][]string{
	"outbox_producer": {"enqueue", "enqueue_batch", "producer_limits"},
	"outbox_dispatcher": {"claim_batch", "claimable_estimate", "complete_batch", "complete", "repair_expired_leases", "purge", "ensure_archive_partitions", "stats", "blocked_keys", "pauses",
		"gate_targets", "record_target_outcomes", "open_breakers"},
	"outbox_operator": {"replay_dead", "discard", "purge_audit", "grant_namespace", "revoke_namespace", "unconfine_producer",
		"stats", "blocked_keys", "pending_messages", "pauses", "retry_now", "purge_dead", "pause", "resume", "producer_limits", "open_breakers"},
	"outbox_reader": {"stats", "blocked_keys", "pending_messages", "pauses", "producer_limits", "open_breakers"},
}

// readableTables are the tables each role may SELECT; no role may do
// anything else to any table.
var readableTables = map[string][]string{
	"outbox_operator": {"pending", "attempts", "dead", "limits", "producer_namespaces", "confined_producers", "operator_log", "paused", "breakers", "rate_limits"},
	"outbox_reader":   {"pending", "attempts", "dead", "limits", "producer_namespaces", "confined_producers", "operator_log", "paused", "breakers", "rate_limits"},
}

type function struct {
	name      string // e.g. claim_batch
	signature string // e.g. outbox.claim_batch(integer,text,integer,text[])
	call      string // a call with a NULL for every argument
	trigger   bool
}

type table struct {
	name, column string
}

func catalog(t *testing.T, conn *pgx.Conn) ([]table, []string, []function) {
	t.Helper()
	ctx := context.Background()
	var tables []table
	// A column that may be written (not an identity or generated column),
	// so that nothing but the missing privilege can refuse the statement.
	rows, err := conn.Query(ctx, `SELECT c.relname, (SELECT a.attname FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0
			AND NOT a.attisdropped AND a.attidentity = '' AND a.attgenerated = '' ORDER BY a.attnum LIMIT 1)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'p') ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tb table
		if err := rows.Scan(&tb.name, &tb.column); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, tb)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	sequences, err := pgx.CollectRows(must(conn.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'outbox' AND c.relkind = 'S' ORDER BY 1`)), pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	rows, err = conn.Query(ctx, `SELECT p.proname, p.oid::regprocedure::text, p.prorettype = 'trigger'::regtype,
			coalesce((SELECT string_agg('NULL::' || format_type(a.t, NULL), ', ' ORDER BY a.i)
			          FROM unnest(p.proargtypes) WITH ORDINALITY AS a(t, i)), '')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'outbox' ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	var functions []function
	for rows.Next() {
		var f function
		var args string
		if err := rows.Scan(&f.name, &f.signature, &f.trigger, &args); err != nil {
			t.Fatal(err)
		}
		f.call = fmt.Sprintf("SELECT outbox.%s(%s)", pgx.Identifier{f.name}.Sanitize(), args)
		functions = append(functions, f)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(tables) < 5 || len(sequences) < 1 || len(functions) < 12 {
		t.Fatalf("the catalog walk found %d tables, %d sequences, %d functions: it is broken", len(tables), len(sequences), len(functions))
	}
	return tables, sequences, functions
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// tried counts the forbidden acts attempted, for the test's log.
var tried atomic.Int64

// denied runs sql and requires SQLSTATE 42501.
func denied(t *testing.T, conn *pgx.Conn, what, sql string) {
	t.Helper()
	ctx := context.Background()
	tried.Add(1)
	_, err := conn.Exec(ctx, sql)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != insufficientPrivilege {
		t.Errorf("%s: %v, want permission denied (42501)\n    %s", what, err, sql)
	}
}

func TestEveryForbiddenActIsDenied(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// A little of everything, so that no statement is refused merely for
	// lack of rows.
	store := lease.NewStore(db.Pool)
	for i := range 3 {
		m := outbox.Message{Namespace: "billing", Topic: "usage", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)),
			DedupeKey: fmt.Sprintf("k-%d", i), OrderingKey: "acct-1"}
		if _, err := outbox.Enqueue(ctx, db.Pool, m); err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("seed claim: %d %v", len(msgs), err)
	}
	if _, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: outboxtype.OutcomeFailed, ErrorCode: "X"}}); err != nil {
		t.Fatal(err)
	}

	// A function a later migration adds, created as such migrations do (as
	// the owner): closed to PUBLIC, so to every role, until granted.
	createdLater(t, db)

	tables, sequences, functions := catalog(t, pgtest.Connect(t, db.URL))
	admin := db.Pool

	// The roles one after another: their login users are granted CONNECT
	// on the same database, and concurrent grants and revokes of one
	// database's ACL collide ("tuple concurrently updated").
	for _, role := range runtimeRoles {
		t.Run(role, func(t *testing.T) {
			login := db.LoginAs(t, role)
			conn := pgtest.Connect(t, login)
			var loginUser string
			if err := conn.QueryRow(ctx, `SELECT current_user`).Scan(&loginUser); err != nil {
				t.Fatal(err)
			}

			// Tables: the catalog's view of every privilege, then the acts.
			for _, tb := range tables {
				qualified := "outbox." + pgx.Identifier{tb.name}.Sanitize()
				col := pgx.Identifier{tb.column}.Sanitize()
				mayRead := slices.Contains(readableTables[role], tb.name)
				for _, priv := range []string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"} {
					var has bool
					if err := admin.QueryRow(ctx, `SELECT has_table_privilege($1, $2, $3)`, loginUser, qualified, priv).Scan(&has); err != nil {
						t.Fatal(err)
					}
					if want := priv == "SELECT" && mayRead; has != want {
						t.Errorf("%s on %s: has %v, want %v", priv, qualified, has, want)
					}
				}
				denied(t, conn, "INSERT "+tb.name, `INSERT INTO `+qualified+` DEFAULT VALUES`)
				denied(t, conn, "INSERT … SELECT "+tb.name, `INSERT INTO `+qualified+` (`+col+`) SELECT `+col+` FROM `+qualified+` LIMIT 0`)
				denied(t, conn, "UPDATE "+tb.name, `UPDATE `+qualified+` SET `+col+` = `+col)
				denied(t, conn, "DELETE "+tb.name, `DELETE FROM `+qualified)
				denied(t, conn, "TRUNCATE "+tb.name, `TRUNCATE `+qualified)
				denied(t, conn, "SELECT FOR UPDATE "+tb.name, `SELECT 1 FROM `+qualified+` FOR UPDATE`)
				if !mayRead {
					denied(t, conn, "SELECT "+tb.name, `SELECT count(*) FROM `+qualified)
				}
				denied(t, conn, "ALTER TABLE "+tb.name, `ALTER TABLE `+qualified+` ADD COLUMN planted int`)
				denied(t, conn, "ALTER TABLE … DISABLE TRIGGER "+tb.name, `ALTER TABLE `+qualified+` DISABLE TRIGGER ALL`)
				denied(t, conn, "CREATE INDEX "+tb.name, `CREATE INDEX planted ON `+qualified+` (`+col+`)`)
				denied(t, conn, "CREATE TRIGGER "+tb.name, `CREATE TRIGGER planted BEFORE INSERT ON `+qualified+` FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()`)
				denied(t, conn, "CREATE RULE "+tb.name, `CREATE RULE planted AS ON INSERT TO `+qualified+` DO INSTEAD NOTHING`)
				denied(t, conn, "CREATE POLICY "+tb.name, `CREATE POLICY planted ON `+qualified+` USING (false)`)
				denied(t, conn, "COMMENT "+tb.name, `COMMENT ON TABLE `+qualified+` IS 'planted'`)
				denied(t, conn, "REINDEX "+tb.name, `REINDEX TABLE `+qualified)
				denied(t, conn, "DROP TABLE "+tb.name, `DROP TABLE `+qualified)
				denied(t, conn, "LOCK "+tb.name, `BEGIN; LOCK TABLE `+qualified+` IN ACCESS EXCLUSIVE MODE; COMMIT`)
				_, _ = conn.Exec(ctx, `ROLLBACK`)
			}

			// Sequences (the archive's identity among them): no use, no reset.
			for _, seq := range sequences {
				qualified := "outbox." + pgx.Identifier{seq}.Sanitize()
				for _, priv := range []string{"USAGE", "SELECT", "UPDATE"} {
					var has bool
					if err := admin.QueryRow(ctx, `SELECT has_sequence_privilege($1, $2, $3)`, loginUser, qualified, priv).Scan(&has); err != nil {
						t.Fatal(err)
					}
					if has {
						t.Errorf("%s on sequence %s granted", priv, qualified)
					}
				}
				denied(t, conn, "nextval "+seq, `SELECT nextval('`+qualified+`')`)
				denied(t, conn, "setval "+seq, `SELECT setval('`+qualified+`', 1)`)
				denied(t, conn, "ALTER SEQUENCE "+seq, `ALTER SEQUENCE `+qualified+` RESTART`)
				denied(t, conn, "DROP SEQUENCE "+seq, `DROP SEQUENCE `+qualified)
			}

			// Functions: exactly the granted ones are executable; every
			// other one is refused before its body runs (a NULL for every
			// argument would otherwise fail inside it, with another code).
			for _, f := range functions {
				var has bool
				if err := admin.QueryRow(ctx, `SELECT has_function_privilege($1, $2, 'EXECUTE')`, loginUser, f.signature).Scan(&has); err != nil {
					t.Fatal(err)
				}
				granted := slices.Contains(grantedFunctions[role], f.name)
				if has != granted {
					t.Errorf("EXECUTE on %s: has %v, want %v", f.signature, has, granted)
				}
				if !granted {
					denied(t, conn, "call "+f.signature, f.call)
				}
				denied(t, conn, "ALTER FUNCTION "+f.signature, `ALTER FUNCTION `+f.signature+` SECURITY INVOKER`)
				denied(t, conn, "ALTER FUNCTION … SET "+f.signature, `ALTER FUNCTION `+f.signature+` SET search_path = public`)
				denied(t, conn, "ALTER FUNCTION … OWNER "+f.signature, `ALTER FUNCTION `+f.signature+` OWNER TO `+pgx.Identifier{loginUser}.Sanitize())
				denied(t, conn, "DROP FUNCTION "+f.signature, `DROP FUNCTION `+f.signature)
				denied(t, conn, "CREATE OR REPLACE "+f.signature, `CREATE OR REPLACE FUNCTION outbox.`+pgx.Identifier{f.name}.Sanitize()+`() RETURNS int LANGUAGE sql AS 'SELECT 1'`)
			}
			for _, name := range []string{"uuid_v7", "attempts_append_only", "added_later"} {
				if !slices.ContainsFunc(functions, func(f function) bool { return f.name == name }) {
					t.Errorf("outbox.%s not found in the catalog", name)
				}
			}

			// The schema itself.
			for what, sql := range map[string]string{
				"CREATE TABLE in outbox":    `CREATE TABLE outbox.planted (n int)`,
				"CREATE VIEW in outbox":     `CREATE VIEW outbox.planted AS SELECT 1 AS n`,
				"CREATE FUNCTION in outbox": `CREATE FUNCTION outbox.planted() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
				"CREATE SEQUENCE in outbox": `CREATE SEQUENCE outbox.planted`,
				"CREATE TYPE in outbox":     `CREATE TYPE outbox.planted AS (n int)`,
				"ALTER SCHEMA outbox":       `ALTER SCHEMA outbox RENAME TO planted`,
				"ALTER SCHEMA outbox OWNER": `ALTER SCHEMA outbox OWNER TO ` + pgx.Identifier{loginUser}.Sanitize(),
				"DROP SCHEMA outbox":        `DROP SCHEMA outbox CASCADE`,
				"COMMENT ON SCHEMA outbox":  `COMMENT ON SCHEMA outbox IS 'planted'`,
			} {
				denied(t, conn, what, sql)
			}
			var create bool
			if err := admin.QueryRow(ctx, `SELECT has_schema_privilege($1, 'outbox', 'CREATE')`, loginUser).Scan(&create); err != nil || create {
				t.Errorf("CREATE on schema outbox: %v %v", create, err)
			}

			// Granting what one does not hold grants nothing (PostgreSQL
			// only warns), so nothing may have changed.
			for _, tb := range tables {
				_, _ = conn.Exec(ctx, `GRANT ALL ON outbox.`+pgx.Identifier{tb.name}.Sanitize()+` TO PUBLIC`)
			}
			_, _ = conn.Exec(ctx, `GRANT ALL ON ALL FUNCTIONS IN SCHEMA outbox TO PUBLIC`)
			var leaked []string
			rows, err := admin.Query(ctx, `SELECT c.relname || ': ' || a.privilege_type
				FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
				WHERE n.nspname = 'outbox' AND a.grantee = 0
				UNION ALL
				SELECT p.proname || ': EXECUTE' FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
				WHERE n.nspname = 'outbox' AND a.grantee = 0`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var s string
				rows.Scan(&s)
				leaked = append(leaked, s)
			}
			if len(leaked) > 0 {
				t.Errorf("PUBLIC holds privileges in schema outbox: %s", strings.Join(leaked, "; "))
			}
		})
	}
	t.Logf("%d forbidden acts tried on %d tables, %d sequences and %d functions, by %d roles",
		tried.Load(), len(tables), len(sequences), len(functions), len(runtimeRoles))
}

// createdLater creates outbox.added_later() as a later migration would: a
// SECURITY DEFINER function of the owner's, granted to no one.
func createdLater(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, stmt := range []string{
		`SET LOCAL ROLE outbox_owner`,
		`CREATE FUNCTION outbox.added_later() RETURNS int LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS 'SELECT 1'`,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// A granted function refuses the arguments that would turn it against
// another team or against the audit trail, before writing anything.
func TestEveryMisuseOfAGrantedFunctionIsRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	producer := pgtest.Connect(t, db.LoginAs(t, "outbox_producer"))
	var login string
	if err := producer.QueryRow(ctx, `SELECT current_user`).Scan(&login); err != nil {
		t.Fatal(err)
	}
	operator := pgtest.Connect(t, db.LoginAs(t, "outbox_operator"))
	if _, err := operator.Exec(ctx, `SELECT outbox.grant_namespace($1, 'reporting')`, login); err != nil {
		t.Fatal(err)
	}
	dispatcher := pgtest.Connect(t, db.LoginAs(t, "outbox_dispatcher"))

	const notPayments = `namespace 'payments'`
	for _, c := range []struct {
		conn       *pgx.Conn
		what, sql  string
		code, text string
	}{
		// A producer confined to namespace reporting, against payments.
		{producer, "enqueue into another namespace",
			`SELECT * FROM outbox.enqueue('payments', 'captured', '{"amount": 1}')`, insufficientPrivilege, notPayments},
		{producer, "enqueue_batch with one message in another namespace",
			`SELECT * FROM outbox.enqueue_batch(ARRAY['reporting', 'payments'], ARRAY['daily', 'captured'], ARRAY['{"a": 1}', '{"a": 2}'])`, insufficientPrivilege, notPayments},
		{producer, "squat another namespace's dedupe key",
			`SELECT * FROM outbox.enqueue('payments', 'captured', '{"amount": 1000000}', p_dedupe_key => 'pay-77')`, insufficientPrivilege, notPayments},
		{producer, "squat another namespace's dedupe key in a batch",
			`SELECT * FROM outbox.enqueue_batch(ARRAY['payments'], ARRAY['captured'], ARRAY['{"amount": 1000000}'], p_dedupe_keys => ARRAY['pay-77'])`, insufficientPrivilege, notPayments},
		{producer, "block another namespace's ordering key for 300 days",
			`SELECT * FROM outbox.enqueue('payments', 'captured', '{"x": 1}', p_ordering_key => 'acct-9', p_available_at => now() + interval '300 days')`, insufficientPrivilege, notPayments},
		{producer, "block another namespace's ordering key for ever",
			`SELECT * FROM outbox.enqueue('payments', 'captured', '{"x": 1}', p_ordering_key => 'acct-9', p_available_at => 'infinity')`, insufficientPrivilege, notPayments},
		{producer, "block another namespace's ordering key for ever in a batch",
			`SELECT * FROM outbox.enqueue_batch(ARRAY['payments'], ARRAY['captured'], ARRAY['{"x": 1}'], p_ordering_keys => ARRAY['acct-9'], p_available_at => ARRAY['infinity'::timestamptz])`, insufficientPrivilege, notPayments},
		// Nor its own ordering key (an infinite hold is no message).
		{producer, "block its own ordering key for ever",
			`SELECT * FROM outbox.enqueue('reporting', 'daily', '{"x": 1}', p_ordering_key => 'acct-9', p_available_at => 'infinity')`, "P7004", "available_at must be a finite time"},

		// The dispatcher's retention purge, below the floor of an hour.
		{dispatcher, "purge everything", `SELECT * FROM outbox.purge('0 seconds', '0 seconds', 1000000)`, "22023", "at least 1 hour"},
		{dispatcher, "purge the archive below the floor", `SELECT * FROM outbox.purge('59 minutes', NULL, 100)`, "22023", "at least 1 hour"},
		{dispatcher, "purge dedupe keys below the floor", `SELECT * FROM outbox.purge(NULL, '59 minutes', 100)`, "22023", "at least 1 hour"},
		{dispatcher, "purge ordering keys below the floor", `SELECT * FROM outbox.purge(NULL, NULL, 100, '59 minutes')`, "22023", "at least 1 hour"},
		{dispatcher, "purge with a negative retention", `SELECT * FROM outbox.purge('-1 day', NULL, 100)`, "22023", "at least 1 hour"},
		// Operators' actions are an operator's to purge, and not under a day.
		{dispatcher, "erase the audit trail", `SELECT outbox.purge_audit('1 day', 100)`, insufficientPrivilege, "permission denied for function purge_audit"},
		{operator, "shorten the audit trail below a day", `SELECT outbox.purge_audit('23 hours', 100)`, "22023", "at least 1 day"},
		// Dead letters younger than a day may not have been looked at yet;
		// no pause, purge or retry without a reason.
		{operator, "purge dead letters below a day", `SELECT * FROM outbox.purge_dead('23 hours', 100, 'ana', 'cleanup')`, "22023", "at least 1 day"},
		{operator, "purge dead letters without a reason", `SELECT * FROM outbox.purge_dead('30 days', 100, 'ana', ' ')`, "22023", "a reason is required"},
		{operator, "pause without a reason", `SELECT outbox.pause('payments', NULL, 'ana', NULL)`, "22023", "a reason is required"},
		{operator, "pause every namespace", `SELECT outbox.pause('*', NULL, 'ana', 'incident')`, "22023", "is not a namespace"},
		{operator, "retry without a reason", `SELECT * FROM outbox.retry_now(ARRAY[gen_random_uuid()], '')`, "22023", "a reason is required"},
	} {
		_, err := c.conn.Exec(ctx, c.sql)
		if sqlstate(err) != c.code || !strings.Contains(fmt.Sprint(err), c.text) {
			t.Errorf("%s: %v, want SQLSTATE %s saying %q\n    %s", c.what, err, c.code, c.text, c.sql)
		}
	}

	// Refused before anything was written: no message, no dedupe key, no
	// ordering key, nothing purged.
	var written int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.dedupe)
		+ (SELECT count(*) FROM outbox.sequences) + (SELECT count(*) FROM outbox.keys)
		+ (SELECT count(*) FROM outbox.operator_log WHERE action IN ('purge_audit', 'purge_dead', 'pause'))
		+ (SELECT count(*) FROM outbox.paused)`).Scan(&written); err != nil || written != 0 {
		t.Fatalf("the refused calls left %d rows (%v)", written, err)
	}
}

// A caller controls its own temporary schema. pg_temp is searched first
// for relations unless a function's search_path names it, and last, as
// every SECURITY DEFINER function of schema outbox does (pg_catalog,
// pg_temp): a temporary table named like an outbox table, or temporary
// functions named like the built-ins the functions call, must never be
// used by them. Each runtime role plants them and calls what it may.
func TestDefinerFunctionsIgnoreCallersTemporaryObjects(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// A dead letter for the operator to replay.
	seed := lease.NewStore(db.Pool)
	if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "temp-dead", Topic: "t", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	msgs, err := seed.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "seed", BatchSize: 1, Lease: time.Minute, Namespaces: []string{"temp-dead"}})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("seed claim: %d %v", len(msgs), err)
	}
	if _, err := seed.CompleteBatch(ctx, "seed", []lease.Result{{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: outboxtype.OutcomeFailed, ErrorCode: "X"}}); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"outbox_producer", "outbox_dispatcher", "outbox_operator"} {
		t.Run(role, func(t *testing.T) {
			conn := pgtest.Connect(t, db.LoginAs(t, role))
			plant := []string{
				`CREATE TEMP TABLE hits (what text)`,
				// Decoys of every outbox table, with a trigger that records
				// any write, and rows that would show in any read.
				`CREATE FUNCTION pg_temp.hit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO pg_temp.hits VALUES (TG_TABLE_NAME || ' ' || TG_OP); RETURN NEW; END $$`,
			}
			for _, name := range []string{"pending", "attempts", "dead", "sequences", "dedupe"} {
				plant = append(plant,
					`CREATE TEMP TABLE `+name+` (id uuid, message_id uuid, namespace text, topic text, payload jsonb)`,
					`CREATE TRIGGER hit BEFORE INSERT OR UPDATE OR DELETE ON pg_temp.`+name+` FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.hit()`)
			}
			// Decoys of the built-ins the functions call unqualified.
			for _, decoy := range []string{
				`now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2000-01-01'::timestamptz $$`,
				`gen_random_uuid() RETURNS uuid LANGUAGE sql AS $$ SELECT '00000000-0000-0000-0000-000000000000'::uuid $$`,
				`uuid_v7() RETURNS uuid LANGUAGE sql AS $$ SELECT '00000000-0000-0000-0000-000000000000'::uuid $$`,
				`make_interval(secs double precision) RETURNS interval LANGUAGE sql AS $$ SELECT interval '100 years' $$`,
				`jsonb_to_recordset(jsonb) RETURNS SETOF record LANGUAGE sql AS $$ SELECT NULL::record WHERE false $$`,
				`set_config(text, text, boolean) RETURNS text LANGUAGE sql AS $$ SELECT 'on' $$`,
			} {
				plant = append(plant, `CREATE FUNCTION pg_temp.`+decoy)
			}
			// pg_temp first: an unqualified name in a function that did not
			// pin its own search_path would now find the decoys.
			plant = append(plant, `SET search_path = pg_temp, public, pg_catalog`)
			for _, s := range plant {
				if _, err := conn.Exec(ctx, s); err != nil {
					t.Fatalf("%s: %v", s, err)
				}
			}

			var calls []string
			switch role {
			case "outbox_producer":
				res, err := outbox.Enqueue(ctx, conn, outbox.Message{Namespace: "temp", Topic: "decoy", Payload: []byte(`{"n":1}`),
					DedupeKey: "d-" + role, OrderingKey: "o-" + role})
				if err != nil {
					t.Fatal(err)
				}
				if res.ID.Version() != 7 || res.SequenceID != 1 {
					t.Fatalf("enqueue through the decoys: %+v", res)
				}
				if _, err := outbox.EnqueueBatch(ctx, conn, []outbox.Message{
					{Namespace: "temp", Topic: "decoy", Payload: []byte(`{"n":2}`), OrderingKey: "o-" + role},
					{Namespace: "temp", Topic: "decoy", Payload: []byte(`{"n":3}`), DedupeKey: "d-" + role},
				}); err != nil {
					t.Fatal(err)
				}
				calls = []string{"enqueue", "enqueue_batch"}
			case "outbox_dispatcher":
				store := lease.NewStore(conn)
				if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "temp", Topic: "claim", Payload: []byte(`{}`)}); err != nil {
					t.Fatal(err)
				}
				msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: role, BatchSize: 100, Lease: time.Minute, Namespaces: []string{"temp"}})
				if err != nil || len(msgs) == 0 {
					t.Fatalf("claim through the decoys: %d, %v", len(msgs), err)
				}
				for _, m := range msgs {
					if m.LeaseToken.String() == "00000000-0000-0000-0000-000000000000" || time.Until(m.LeaseExpiresAt) > 2*time.Minute ||
						m.LeaseExpiresAt.Year() == 2000 {
						t.Fatalf("claim used a decoy: token %s, expiry %s", m.LeaseToken, m.LeaseExpiresAt)
					}
				}
				completions, err := store.CompleteBatch(ctx, role, dispatchedResults(msgs))
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range completions {
					if c.Status != outboxtype.StatusOK {
						t.Fatalf("completion through the decoys: %s", c.Status)
					}
				}
				if _, err := store.RepairExpiredLeases(ctx, role, 10); err != nil {
					t.Fatal(err)
				}
				if _, err := store.ClaimableEstimate(ctx, 10, []string{"temp"}); err != nil {
					t.Fatal(err)
				}
				if _, err := store.Purge(ctx, lease.PurgeParams{AttemptsOlderThan: time.Hour, DedupeOlderThan: time.Hour, MaxRows: 10}); err != nil {
					t.Fatal(err)
				}
				if _, err := store.Stats(ctx); err != nil {
					t.Fatal(err)
				}
				calls = []string{"claim_batch", "complete_batch", "repair_expired_leases", "claimable_estimate", "purge", "stats"}
			case "outbox_operator":
				store := lease.NewStore(conn)
				moved, err := store.ReplayDead(ctx, lease.ReplayRequest{Namespace: "temp-dead", Limit: 10, DryRun: false, Reason: "decoy test"})
				if err != nil || len(moved) != 1 {
					t.Fatalf("replay through the decoys: %v, %v", moved, err)
				}
				if _, err := store.Stats(ctx); err != nil {
					t.Fatal(err)
				}
				calls = []string{"replay_dead", "stats"}
			}

			var hits []string
			rows, err := conn.Query(ctx, `SELECT what FROM pg_temp.hits`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var s string
				rows.Scan(&s)
				hits = append(hits, s)
			}
			if len(hits) > 0 {
				t.Fatalf("%v wrote to the caller's temporary decoys: %v", calls, hits)
			}
			var decoyRows int
			if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_temp.pending) + (SELECT count(*) FROM pg_temp.attempts)
				+ (SELECT count(*) FROM pg_temp.dead) + (SELECT count(*) FROM pg_temp.sequences) + (SELECT count(*) FROM pg_temp.dedupe)`).Scan(&decoyRows); err != nil || decoyRows != 0 {
				t.Fatalf("decoy tables hold %d rows (%v)", decoyRows, err)
			}
		})
	}

	// The pins themselves: every SECURITY DEFINER function, and every
	// trigger function, sets search_path to pg_catalog then pg_temp (so
	// that pg_temp is searched last, not first).
	conn := pgtest.Connect(t, db.URL)
	rows, err := conn.Query(ctx, `SELECT p.oid::regprocedure::text, coalesce((SELECT c FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%'), '')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'outbox' AND (p.prosecdef OR p.prorettype = 'trigger'::regtype)`)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for rows.Next() {
		var sig, path string
		if err := rows.Scan(&sig, &path); err != nil {
			t.Fatal(err)
		}
		checked++
		if path != "search_path=pg_catalog, pg_temp" {
			t.Errorf("%s: %q, want search_path=pg_catalog, pg_temp", sig, path)
		}
	}
	if checked < 10 {
		t.Fatalf("only %d functions checked", checked)
	}
}

func dispatchedResults(msgs []outboxtype.Message) []lease.Result {
	out := make([]lease.Result, len(msgs))
	for i, m := range msgs {
		out[i] = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeDispatched, Target: "test"}
	}
	return out
}
