package dbpool_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// openURL opens the pool cfg describes with url as its source, closed when
// the test ends.
func openURL(t *testing.T, url string, cfg dbpool.Config, deps dbpool.Deps) *dbpool.Pool {
	t.Helper()
	cfg.Source, cfg.DatabaseURL = dbpool.SourceURL, dbpool.ConnString(url)
	pool, err := dbpool.Open(context.Background(), cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func show(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, setting string) string {
	t.Helper()
	var v string
	if err := q.QueryRow(context.Background(), "SELECT current_setting($1)", setting).Scan(&v); err != nil {
		t.Fatalf("show %s: %v", setting, err)
	}
	return v
}

func TestOpenURLAppliesSessionSettings(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := openURL(t, db.URL, dbpool.Config{}, dbpool.Deps{ApplicationName: "outbox-dispatcher/dispatch"})

	for setting, want := range map[string]string{
		"statement_timeout":                   "30s",
		"idle_in_transaction_session_timeout": "10s",
		"application_name":                    "outbox-dispatcher/dispatch",
	} {
		if got := show(t, pool, setting); got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	// Set at startup, so they are the session defaults: RESET keeps them,
	// where a SET statement's value would be lost.
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(context.Background(), "RESET ALL"); err != nil {
		t.Fatal(err)
	}
	if got := show(t, conn, "statement_timeout"); got != "30s" {
		t.Errorf("statement_timeout after RESET ALL = %q, want the startup value 30s", got)
	}
	if got := pool.Config().MaxConns; got != 2 {
		t.Errorf("MaxConns = %d, want 2", got)
	}
	if got := pool.Config().ConnConfig.ConnectTimeout; got != 5*time.Second {
		t.Errorf("ConnectTimeout = %s, want 5s", got)
	}
}

func TestOpenURLDefaultApplicationName(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := openURL(t, db.URL, dbpool.Config{MaxConns: 5}, dbpool.Deps{})
	if got := show(t, pool, "application_name"); got != dbpool.DefaultApplicationName {
		t.Errorf("application_name = %q, want %q", got, dbpool.DefaultApplicationName)
	}
	if got := pool.Config().MaxConns; got != 5 {
		t.Errorf("MaxConns = %d, want 5", got)
	}
}

func TestStatementTimeoutIsHonoured(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := openURL(t, db.URL, dbpool.Config{StatementTimeout: 300 * time.Millisecond}, dbpool.Deps{})

	// 57014 is the server cancelling the sleep, which would otherwise
	// end by itself, without an error, a minute later.
	_, err := pool.Exec(context.Background(), "SELECT pg_sleep(60)")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("pg_sleep(60) with a 300ms statement timeout: err = %v, want SQLSTATE 57014", err)
	}
}

func TestIdleInTransactionTimeoutEndsTheSession(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := openURL(t, db.URL, dbpool.Config{IdleInTransactionTimeout: 100 * time.Millisecond}, dbpool.Deps{})
	ctx := context.Background()

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var pid int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if got := show(t, tx, "idle_in_transaction_session_timeout"); got != "100ms" {
		t.Fatalf("idle_in_transaction_session_timeout = %q, want 100ms", got)
	}
	// The server, not the client, ends the idle transaction: watch its
	// backend go away rather than sleeping a fixed time.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var alive bool
		if err := db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive); err != nil {
			t.Fatal(err)
		}
		if !alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle transaction's session is still alive after 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("the transaction still works after its session was ended")
	}
}

// ClaimBatch and Enqueue run on one connection, whose prepared statements are
// then listed: none under the simple protocol (nothing for RDS Proxy to pin
// on), the store's own under the statement cache.
func TestSimpleProtocolWorksWithTheOutboxStore(t *testing.T) {
	t.Parallel()
	for _, simple := range []bool{true, false} {
		name := map[bool]string{true: "simple protocol", false: "statement cache"}[simple]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			pool := openURL(t, db.URL, dbpool.Config{SimpleProtocol: simple}, dbpool.Deps{})
			ctx := context.Background()
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()

			enqueued, err := outbox.Enqueue(ctx, conn, outbox.Message{
				Namespace:   "billing",
				Topic:       "usage_snapshot",
				Payload:     json.RawMessage(`{"tenant":"t-42","units":7}`),
				DedupeKey:   "t-42/turn-1",
				OrderingKey: "billing:t-42",
				Headers:     map[string]string{"x-tenant": "t-42"},
			})
			if err != nil {
				t.Fatalf("Enqueue: %v", err)
			}
			claimed, err := lease.NewStore(conn).ClaimBatch(ctx, lease.ClaimParams{
				WorkerID: "worker-1", BatchSize: 10, Lease: time.Minute, Namespaces: []string{"billing"},
			})
			if err != nil {
				t.Fatalf("ClaimBatch: %v", err)
			}
			if len(claimed) != 1 || claimed[0].ID != enqueued.ID || claimed[0].Headers["x-tenant"] != "t-42" ||
				claimed[0].SequenceID != enqueued.SequenceID || claimed[0].Attempt != 1 {
				t.Fatalf("ClaimBatch = %+v, want the enqueued message %+v", claimed, enqueued)
			}

			rows, err := conn.Query(ctx, "SELECT statement FROM pg_prepared_statements", pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				t.Fatal(err)
			}
			statements, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if simple && len(statements) != 0 {
				t.Errorf("simple protocol: prepared statements %q, want none", statements)
			}
			if !simple && !containsSubstring(statements, "outbox.claim_batch") {
				t.Errorf("statement cache: prepared statements %q, want the claim among them", statements)
			}
		})
	}
}

func containsSubstring(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// SSLMode overrides the URL's sslmode, in both URL and key=value
// form. The test server has TLS; pg_stat_ssl shows whether it is in use.
func TestSSLModeOverridesTheURL(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	requireTLS(t, db)
	cc, err := pgconn.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	keywordValue := "host=" + cc.Host + " port=" + strconv.Itoa(int(cc.Port)) + " user=" + cc.User + " dbname=" + db.Name + " sslmode=disable"
	for name, url := range map[string]string{
		"URL":       strings.Replace(db.URL, "sslmode=disable", "sslmode=disable&application_name=x", 1),
		"key=value": keywordValue,
	} {
		for _, mode := range []string{"disable", "require"} {
			pool := openURL(t, url, dbpool.Config{SSLMode: mode}, dbpool.Deps{})
			var tls bool
			if err := pool.QueryRow(context.Background(), "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&tls); err != nil {
				t.Fatal(err)
			}
			if tls != (mode == "require") {
				t.Errorf("%s with sslmode=disable and SSLMode %s: TLS in use = %t", name, mode, tls)
			}
		}
	}
}

// requireTLS fails the test when the test server does not offer TLS, which
// the tests of TLS settings need.
func requireTLS(t *testing.T, db *pgtest.DB) {
	t.Helper()
	if got := show(t, db.Pool, "ssl"); got != "on" {
		t.Fatalf("the test server has ssl=%s; these tests need a server that offers TLS", got)
	}
}

func TestOpenHandBuiltConfigTakesDefaults(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool, err := dbpool.Open(context.Background(), dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: dbpool.ConnString(db.URL)}, dbpool.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := show(t, pool, "idle_in_transaction_session_timeout"); got != "10s" {
		t.Errorf("idle_in_transaction_session_timeout = %q, want the default 10s", got)
	}

	_, err = dbpool.Open(context.Background(), dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: dbpool.ConnString(db.URL), MaxConns: 1000}, dbpool.Deps{})
	if !hasProblem(err, "MaxConns", "got 1000") {
		t.Errorf("Open with MaxConns 1000: err = %v, want a ConfigError naming MaxConns", err)
	}
}

// A failed Open says which source and where, keeps the SQLSTATE reachable,
// and does not show the password.
func TestOpenURLErrorsAreRedacted(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const password = "n0t-For-Logs"

	// A database that does not exist: the server answers 3D000.
	cc, err := pgconn.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	missing := "postgres://" + cc.User + ":" + password + "@" + net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))) + "/no_such_database_" + db.Name + "?sslmode=disable"
	// Names name the source in the error, as the config package's do.
	cfg := dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: dbpool.ConnString(missing), Names: dbpool.Names{DatabaseURL: "DB_URL"}}
	_, err = dbpool.Open(context.Background(), cfg, dbpool.Deps{})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" {
		t.Fatalf("Open on a missing database: err = %v, want SQLSTATE 3D000", err)
	}
	assertNoSecret(t, "error", err.Error(), password)
	for _, want := range []string{"dbpool: connect to the database", "DB_URL=postgres://" + cc.User + ":xxxxx@", "no_such_database"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}

	// Nobody listening: refused at once, not after a timeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg = dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: dbpool.ConnString("postgres://app:" + password + "@" + addr + "/outbox?sslmode=disable")}
	_, err = dbpool.Open(context.Background(), cfg, dbpool.Deps{})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Open with nobody listening: err = %v, want one naming %s", err, addr)
	}
	assertNoSecret(t, "error", err.Error(), password)
}
