package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

const insufficientPrivilege = "42501"

// Each runtime role logs in through a fresh login user granted only that
// role, and is tried against what it must and must not do.
func TestRolesAreLeastPrivilege(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	seed := outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(`{"n":1}`)}
	if _, err := outbox.Enqueue(ctx, db.Pool, seed); err != nil {
		t.Fatal(err)
	}

	allowed := func(t *testing.T, connString, what, sql string, args ...any) {
		t.Helper()
		conn := pgtest.Connect(t, connString)
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Errorf("%s: %v, want allowed", what, err)
		}
	}
	denied := func(t *testing.T, connString, what, sql string, args ...any) {
		t.Helper()
		conn := pgtest.Connect(t, connString)
		_, err := conn.Exec(ctx, sql, args...)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != insufficientPrivilege {
			t.Errorf("%s: %v, want permission denied (42501)", what, err)
		}
	}

	directWrites := map[string]string{
		"insert pending":   `INSERT INTO outbox.pending (id, namespace, topic, payload) VALUES (gen_random_uuid(), 'n', 't', '{}')`,
		"update pending":   `UPDATE outbox.pending SET attempt_count = 0`,
		"delete pending":   `DELETE FROM outbox.pending`,
		"insert attempts":  `INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic) VALUES (gen_random_uuid(), 1, 'DISPATCHED', 'n', 't')`,
		"delete dead":      `DELETE FROM outbox.dead`,
		"insert dedupe":    `INSERT INTO outbox.dedupe (namespace, topic, dedupe_key, message_id) VALUES ('n', 't', 'k', gen_random_uuid())`,
		"update sequences": `UPDATE outbox.sequences SET last_sequence_id = 0`,
	}
	calls := map[string]string{
		"enqueue":        `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":2}')`,
		"claim_batch":    `SELECT * FROM outbox.claim_batch(1, 'w', 60)`,
		"complete_batch": `SELECT * FROM outbox.complete_batch('w', '[]')`,
		"repair":         `SELECT outbox.repair_expired_leases(10, 'w')`,
		"purge":          `SELECT * FROM outbox.purge(NULL, NULL, 10)`,
		"replay_dead":    `SELECT * FROM outbox.replay_dead(p_dry_run => true)`,
		"stats":          `SELECT * FROM outbox.stats()`,
		"read pending":   `SELECT count(*) FROM outbox.pending`,
		"read attempts":  `SELECT count(*) FROM outbox.attempts`,
		"read dead":      `SELECT count(*) FROM outbox.dead`,
	}
	may := map[string][]string{
		"outbox_producer":   {"enqueue"},
		"outbox_dispatcher": {"claim_batch", "complete_batch", "repair", "purge", "stats"},
		"outbox_operator":   {"replay_dead", "stats", "read pending", "read attempts", "read dead"},
		"outbox_reader":     {"stats", "read pending", "read attempts", "read dead"},
	}
	for role, granted := range may {
		t.Run(role, func(t *testing.T) {
			t.Parallel()
			login := db.LoginAs(t, role)
			ok := map[string]bool{}
			for _, g := range granted {
				ok[g] = true
			}
			for what, sql := range calls {
				if ok[what] {
					allowed(t, login, what, sql)
				} else {
					denied(t, login, what, sql)
				}
			}
			for what, sql := range directWrites {
				denied(t, login, what, sql)
			}
		})
	}

	// The producer's real API works through the role, in its own transaction.
	t.Run("producer API", func(t *testing.T) {
		t.Parallel()
		conn := pgtest.Connect(t, db.LoginAs(t, "outbox_producer"))
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.Enqueue(ctx, tx, seed); err != nil {
			t.Fatalf("enqueue as producer: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("dispatcher API", func(t *testing.T) {
		t.Parallel()
		store := lease.NewStore(pgtest.Connect(t, db.LoginAs(t, "outbox_dispatcher")))
		if _, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute}); err != nil {
			t.Fatalf("claim as dispatcher: %v", err)
		}
		if _, err := store.ReplayDead(ctx, lease.ReplayRequest{Limit: 10, DryRun: true}); err == nil {
			t.Fatal("dispatcher could call replay_dead")
		}
	})
}

// SECURITY DEFINER functions pin search_path: an object planted by a caller
// in a schema it controls must not be picked up instead of the built-in.
func TestDefinerFunctionsIgnoreCallerSearchPath(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	conn := pgtest.Connect(t, db.URL)
	stmts := []string{
		`CREATE SCHEMA evil`,
		`CREATE TABLE evil.hits (n int)`,
		// A decoy of a built-in the functions call, and of a table name.
		`CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$ INSERT INTO evil.hits VALUES (1) RETURNING now() $$`,
		`CREATE FUNCTION evil.gen_random_uuid() RETURNS uuid LANGUAGE sql AS $$ INSERT INTO evil.hits VALUES (2) RETURNING '00000000-0000-0000-0000-000000000000'::uuid $$`,
		`CREATE TABLE evil.pending (id uuid)`,
		`SET search_path = evil, pg_catalog, public`,
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if _, err := conn.Exec(ctx, `SELECT * FROM outbox.enqueue('n', 't', '{}')`); err != nil {
		t.Fatal(err)
	}
	var token string
	if err := conn.QueryRow(ctx, `SELECT lease_token::text FROM outbox.claim_batch(1, 'w', 60)`).Scan(&token); err != nil {
		t.Fatal(err)
	}
	var hits int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM evil.hits`).Scan(&hits); err != nil {
		t.Fatal(err)
	}
	if hits != 0 || token == "00000000-0000-0000-0000-000000000000" {
		t.Fatalf("a function used the caller's decoy objects (%d hits, token %s)", hits, token)
	}
	var unpinned []string
	rows, err := conn.Query(ctx, `SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'outbox' AND p.prosecdef AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		rows.Scan(&name)
		unpinned = append(unpinned, name)
	}
	if len(unpinned) > 0 {
		t.Fatalf("SECURITY DEFINER functions without a fixed search_path: %v", unpinned)
	}
}
