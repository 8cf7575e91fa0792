package dbpool_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/testkit/pgbouncer"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// behindPgBouncer is the test's database through a PgBouncer in
// transaction mode with its default settings.
func behindPgBouncer(t *testing.T) (*pgtest.DB, string) {
	t.Helper()
	db := pgtest.New(t)
	return db, pgbouncer.Start(t).URL(t, db.URL)
}

// PgBouncer's defaults refuse the timeouts as startup parameters: without
// a pooler setting the cold start fails, and says which setting to change.
func TestBehindPgBouncerWithoutThePoolerSettingTheErrorSaysWhatToSet(t *testing.T) {
	t.Parallel()
	_, url := behindPgBouncer(t)
	cfg := dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: dbpool.ConnString(url), SimpleProtocol: true,
		Names: dbpool.Names{Pooler: "OUTBOX_DB_POOLER"}}
	_, err := dbpool.Open(context.Background(), cfg, dbpool.Deps{})
	if err == nil || !strings.Contains(err.Error(), "unsupported startup parameter") || !strings.Contains(err.Error(), "set OUTBOX_DB_POOLER=transaction") {
		t.Fatalf("Open through PgBouncer without a pooler setting: %v, want the refused parameter and the setting to change", err)
	}
}

// Behind PgBouncer in transaction mode the timeouts travel with each
// transaction: a statement longer than the statement timeout is cancelled
// by the server, whichever way it is sent.
func TestBehindPgBouncerTheStatementTimeoutStillFires(t *testing.T) {
	t.Parallel()
	_, url := behindPgBouncer(t)
	pool := openURL(t, url, dbpool.Config{Pooler: dbpool.PoolerTransaction, StatementTimeout: 200 * time.Millisecond}, dbpool.Deps{})
	ctx := context.Background()
	const sleep = "SELECT pg_sleep(30)"

	_, err := pool.Exec(ctx, sleep)
	wantSQLState(t, "Exec", err, "57014")
	rows, err := pool.Query(ctx, sleep)
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
	}
	wantSQLState(t, "Query", err, "57014")
	wantSQLState(t, "QueryRow", pool.QueryRow(ctx, sleep).Scan(new(string)), "57014")
	br := pool.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: "SELECT 1"}, {SQL: sleep}}})
	if _, err := br.Exec(); err != nil {
		t.Errorf("SendBatch: the batch's first statement: %v", err)
	}
	_, err = br.Exec()
	wantSQLState(t, "SendBatch", err, "57014")
	br.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sleep)
		return err
	})
	wantSQLState(t, "a statement of a transaction", err, "57014")

	// And the pool is none the worse: a short statement goes through.
	var n int
	if err := pool.QueryRow(ctx, "SELECT 1").Scan(&n); err != nil || n != 1 {
		t.Errorf("after the timeouts: SELECT 1 = %d, %v", n, err)
	}
}

// The calls answer as pgxpool's do: rows, no rows, command tags, batches
// whose results line up with what was queued, transactions that commit.
func TestBehindPgBouncerThePoolAnswersAsPgxDoes(t *testing.T) {
	t.Parallel()
	_, url := behindPgBouncer(t)
	pool := openURL(t, url, dbpool.Config{Pooler: dbpool.PoolerTransaction}, dbpool.Deps{})
	ctx := context.Background()

	rows, _ := pool.Query(ctx, "SELECT g, current_setting('statement_timeout') FROM generate_series(1, $1::int) g", 3)
	type row struct {
		N       int
		Timeout string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil || len(got) != 3 || got[2].N != 3 || got[0].Timeout != "30s" {
		t.Errorf("Query: %+v, %v; want 3 rows under the default statement timeout 30s", got, err)
	}
	if err := pool.QueryRow(ctx, "SELECT 1 WHERE false").Scan(new(int)); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("QueryRow of nothing: %v, want pgx.ErrNoRows", err)
	}
	if _, err := pool.Query(ctx, "SELEKT 1"); err == nil {
		t.Error("Query of a syntax error: no error")
	}
	tag, err := pool.Exec(ctx, "CREATE TABLE public.t (n int)")
	if err != nil || tag.String() != "CREATE TABLE" {
		t.Fatalf("Exec: %q, %v", tag, err)
	}
	b := &pgx.Batch{}
	b.Queue("INSERT INTO public.t VALUES ($1), ($2)", 1, 2)
	b.Queue("SELECT count(*) FROM public.t")
	br := pool.SendBatch(ctx, b)
	if tag, err := br.Exec(); err != nil || tag.RowsAffected() != 2 {
		t.Errorf("SendBatch: first result %q, %v; want INSERT of 2", tag, err)
	}
	var count int
	if err := br.QueryRow().Scan(&count); err != nil || count != 2 {
		t.Errorf("SendBatch: second result %d, %v", count, err)
	}
	if err := br.Close(); err != nil {
		t.Error(err)
	}
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
		var iso, idle string
		if err := tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation'), current_setting('idle_in_transaction_session_timeout')").Scan(&iso, &idle); err != nil {
			return err
		}
		if iso != "serializable" || idle != "10s" {
			t.Errorf("in a serializable transaction: isolation %s, idle_in_transaction_session_timeout %s", iso, idle)
		}
		_, err := tx.Exec(ctx, "INSERT INTO public.t VALUES (3)")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM public.t").Scan(&count); err != nil || count != 3 {
		t.Errorf("after the transaction: %d rows, %v; want 3", count, err)
	}
}

// Per transaction means nothing stays in the session: the connection's own
// settings are the server's defaults before and after.
func TestTransactionPoolerModeLeavesNothingInTheSession(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := openURL(t, db.URL, dbpool.Config{Pooler: dbpool.PoolerTransaction, MaxConns: 1, StatementTimeout: 1500 * time.Millisecond}, dbpool.Deps{})
	ctx := context.Background()
	if got := show(t, pool, "statement_timeout"); got != "1500ms" {
		t.Errorf("a statement's statement_timeout = %q, want 1500ms", got)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if got := show(t, tx, "idle_in_transaction_session_timeout"); got != "10s" {
			t.Errorf("a transaction's idle_in_transaction_session_timeout = %q, want 10s", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The one connection, asked without the pool's SET LOCAL.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, setting := range []string{"statement_timeout", "idle_in_transaction_session_timeout"} {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&v); err != nil || v != "0" {
			t.Errorf("the session's %s = %q (%v), want the server's 0: a setting outlived its transaction", setting, v, err)
		}
	}
}

func TestTransactionPoolerModeEndsAnIdleTransaction(t *testing.T) {
	t.Parallel()
	_, url := behindPgBouncer(t)
	pool := openURL(t, url, dbpool.Config{Pooler: dbpool.PoolerTransaction, IdleInTransactionTimeout: 100 * time.Millisecond}, dbpool.Deps{})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	// The server ends the transaction; the client learns it at its next
	// statement. Poll rather than sleep a fixed time.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := tx.Exec(ctx, "SELECT 1")
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle transaction is still alive after 30s")
		}
		time.Sleep(150 * time.Millisecond) // longer than the timeout: each round leaves the transaction idle past it
	}
}

func TestMigrationsRefuseATransactionPooler(t *testing.T) {
	t.Parallel()
	cfg := dbpool.Config{Pooler: dbpool.PoolerTransaction, Names: dbpool.Names{Pooler: "OUTBOX_DB_POOLER"}}
	err := cfg.NeedSession("the migrations")
	if err == nil || !strings.Contains(err.Error(), "OUTBOX_DB_POOLER=none") {
		t.Errorf("NeedSession behind a transaction pooler: %v", err)
	}
	if err := (dbpool.Config{}).NeedSession("the migrations"); err != nil {
		t.Errorf("NeedSession without a pooler: %v", err)
	}
}

func TestPoolerSettingIsValidated(t *testing.T) {
	t.Parallel()
	err := dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: "postgres://db/x", Pooler: "session"}.Validate()
	if !hasProblem(err, "Pooler", `got "session"`) {
		t.Errorf("Pooler session: %v", err)
	}
	cfg := dbpool.Config{Pooler: dbpool.PoolerTransaction}.WithDefaults()
	if !cfg.SimpleProtocol {
		t.Error("PoolerTransaction does not imply the simple protocol")
	}
	if got := (dbpool.Config{}).WithDefaults().Pooler; got != dbpool.PoolerNone {
		t.Errorf("default Pooler %q, want none", got)
	}
}
