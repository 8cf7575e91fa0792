package dbpool_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

func wantSQLState(t *testing.T, what string, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != code {
		t.Errorf("%s: err = %v, want SQLSTATE %s", what, err, code)
	}
}

// terminate ends every backend of the test's database but the caller's.
func terminate(t *testing.T, db *pgtest.DB, applicationName string) int {
	t.Helper()
	admin := pgtest.Connect(t, pgtest.URL())
	var n int
	err := admin.QueryRow(context.Background(), `SELECT count(*) FROM (
		SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
		WHERE datname = $1 AND application_name = $2) AS t`, db.Name, applicationName).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A failover terminates every connection. The statement that meets the
// first dead one fails; the pool then drops the others, so the next
// statement connects anew — and resolves the host again — instead of
// failing on the next dead connection. (Pings on acquire are off here: they
// would hide dead idle connections, but only those idle for a second.)
func TestTerminatedConnectionsAreDroppedTogether(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const name = "failover.test.invalid"
	var lookups atomic.Int32
	deps := dbpool.Deps{ApplicationName: "dbpool-failover-test", ConfigurePool: func(pc *pgxpool.Config) {
		pc.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		pc.ConnConfig.Host = name
		pc.ConnConfig.LookupFunc = func(ctx context.Context, host string) ([]string, error) {
			if host != name {
				return nil, fmt.Errorf("unexpected lookup of %q", host)
			}
			lookups.Add(1)
			return []string{"127.0.0.1"}, nil
		}
	}}
	pool := openURL(t, db.URL, dbpool.Config{MaxConns: 2}, deps)
	ctx := context.Background()
	// Two connections, both idle in the pool.
	a, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.Release()
	b.Release()
	before := lookups.Load()
	if n := terminate(t, db, "dbpool-failover-test"); n != 2 {
		t.Fatalf("terminated %d backends, want the pool's 2", n)
	}

	if _, err := pool.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a statement on a terminated connection succeeded")
	}
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("the next statement failed too: the pool kept its other dead connection: %v", err)
	}
	if lookups.Load() == before {
		t.Error("the new connection did not resolve the host again")
	}
}

// After a failover a name may still lead to the demoted primary, now
// read-only: statements fail with 25006 on connections that are otherwise
// fine. The pool drops them, so once the name leads to a writable server
// the next statement works — here the database turns read-only for new
// sessions while the pool connects, and back.
func TestReadOnlyServerDropsThePool(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	admin := pgtest.Connect(t, pgtest.URL())
	ctx := context.Background()
	setReadOnly := func(on bool) {
		t.Helper()
		stmt := "ALTER DATABASE " + pgx.Identifier{db.Name}.Sanitize() + " RESET default_transaction_read_only"
		if on {
			stmt = "ALTER DATABASE " + pgx.Identifier{db.Name}.Sanitize() + " SET default_transaction_read_only = on"
		}
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	setReadOnly(true)
	pool := openURL(t, db.URL, dbpool.Config{MaxConns: 1}, dbpool.Deps{})
	setReadOnly(false)

	const write = "CREATE TABLE public.t (n int)"
	_, err := pool.Exec(ctx, write)
	wantSQLState(t, "a write on the read-only session", err, "25006")
	if _, err := pool.Exec(ctx, write); err != nil {
		t.Fatalf("the next write failed too: the pool kept its read-only connection: %v", err)
	}
}

func TestIsFailover(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{
		"25006": true, "57P01": true, "57P02": true, "57P03": true, "08006": true, "08P01": true, "08000": true,
		"57014": false, "40001": false, "23505": false, "P7002": false, "25P02": false,
	} {
		err := fmt.Errorf("lease: claim: %w", &pgconn.PgError{Code: code})
		if got := dbpool.IsFailover(err); got != want {
			t.Errorf("IsFailover(SQLSTATE %s) = %t, want %t", code, got, want)
		}
	}
	for _, err := range []error{nil, errors.New("x"), context.DeadlineExceeded, &net.OpError{Op: "read"}} {
		if dbpool.IsFailover(err) {
			t.Errorf("IsFailover(%v) = true", err)
		}
	}
}
