// Package pgtest gives each test its own real PostgreSQL database with the
// outbox migrations applied, so that tests run in parallel and never see each
// other's rows.
//
// The server is named by OUTBOX_TEST_DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable); its user must be
// able to create databases and roles. The migrations are applied once per
// migration set to a template database (outbox_tmpl_<hash>), and every test
// database is a cheap copy of it, dropped when the test ends. Set
// OUTBOX_TEST_KEEP_DATABASES=1 to keep them for inspection.
//
// When no server answers, tests fail with the command that starts one: a
// database test that silently skips proves nothing.
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/migrations"
)

// DefaultURL is the server tests use when OUTBOX_TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL is the administrative connection string tests use to create databases.
func URL() string {
	if u := os.Getenv("OUTBOX_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is one test's private, migrated database.
type DB struct {
	// Name is the database name.
	Name string
	// URL connects to it as the administrative (superuser) user.
	URL string
	// Pool is a connection pool on URL, closed when the test ends.
	Pool *pgxpool.Pool
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// New creates a fresh migrated database for t and drops it when t ends.
func New(t testing.TB) *DB {
	t.Helper()
	return NewWithConfig(t, nil)
}

// NewWithConfig is New with a hook to adjust the pool configuration (a
// tracer, a pool size) before the pool is built.
func NewWithConfig(t testing.TB, configure func(*pgxpool.Config)) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	templateOnce.Do(func() { templateName, templateErr = ensureTemplate(ctx) })
	if templateErr != nil {
		t.Fatalf("pgtest: %v", templateErr)
	}

	admin := connectAdmin(ctx, t)
	defer admin.Close(context.Background())

	name := "outbox_t_" + randomSuffix()
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{templateName}.Sanitize())); err != nil {
		t.Fatalf("pgtest: create test database from template %s: %v", templateName, err)
	}
	t.Cleanup(func() { dropDatabase(t, name) })

	dbURL := withDatabase(t, URL(), name)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", dbURL, err)
	}
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: open pool on %s: %v", name, err)
	}
	t.Cleanup(pool.Close)
	return &DB{Name: name, URL: dbURL, Pool: pool}
}

// NewEmpty creates an empty database (no migrations) for t, dropped when t
// ends, and returns its URL: for tests of the migrations themselves.
func NewEmpty(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := connectAdmin(ctx, t)
	defer admin.Close(context.Background())
	name := "outbox_t_" + randomSuffix()
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s", pgx.Identifier{name}.Sanitize())); err != nil {
		t.Fatalf("pgtest: create empty database: %v", err)
	}
	t.Cleanup(func() { dropDatabase(t, name) })
	return withDatabase(t, URL(), name)
}

// LoginAs creates a login role that is a member of grantedRole (for
// example "outbox_producer") and returns a URL that connects to this test's
// database as that role. The role is dropped when the test ends.
func (db *DB) LoginAs(t testing.TB, grantedRole string) string {
	t.Helper()
	ctx := context.Background()
	role := "outbox_t_login_" + randomSuffix()
	admin := connectAdmin(ctx, t)
	defer admin.Close(ctx)
	// No GRANT CONNECT: PUBLIC may connect to a new database, and granting
	// it would update the database's catalog row, which concurrent LoginAs
	// calls on one database would race for ("tuple concurrently updated").
	stmts := []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN", pgx.Identifier{role}.Sanitize()),
		fmt.Sprintf("GRANT %s TO %s", pgx.Identifier{grantedRole}.Sanitize(), pgx.Identifier{role}.Sanitize()),
	}
	for _, stmt := range stmts {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("pgtest: %s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		admin, err := pgx.Connect(ctx, URL())
		if err != nil {
			t.Logf("pgtest: drop role %s: %v", role, err)
			return
		}
		defer admin.Close(ctx)
		// Connections of this role may still be closing; end them first.
		_, _ = admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		// DROP OWNED revokes whatever a test granted the role, which
		// would otherwise block the drop.
		if _, err := admin.Exec(ctx, fmt.Sprintf("DROP OWNED BY %s", pgx.Identifier{role}.Sanitize())); err != nil {
			t.Logf("pgtest: drop owned by %s: %v", role, err)
		}
		if _, err := admin.Exec(ctx, fmt.Sprintf("DROP ROLE IF EXISTS %s", pgx.Identifier{role}.Sanitize())); err != nil {
			t.Logf("pgtest: drop role %s: %v", role, err)
		}
	})
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", db.URL, err)
	}
	u.User = url.User(role)
	return u.String()
}

// Connect opens a single connection to url, closed when the test ends.
func Connect(t testing.TB, connString string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), connString)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Pool opens a connection pool on connString, closed when the test ends:
// for a login of LoginAs that needs several connections.
func Pool(t testing.TB, connString string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), connString)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func connectAdmin(ctx context.Context, t testing.TB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		t.Fatalf("pgtest: %v", unreachable(err))
	}
	return conn
}

func unreachable(err error) error {
	return fmt.Errorf("cannot reach the test PostgreSQL at %s: %w\n"+
		"Start the machine's cluster with:\n"+
		"    pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n"+
		"or point OUTBOX_TEST_DATABASE_URL at a PostgreSQL 15+ server whose user may create databases and roles",
		redact(URL()), err)
}

// ensureTemplate creates (once per migration set, shared by every test
// process on the server) a database with the migrations applied, marked as a
// template. An advisory lock makes concurrent test binaries wait for the
// first one instead of racing it.
func ensureTemplate(ctx context.Context) (string, error) {
	sum, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := "outbox_tmpl_" + sum[:12]

	admin, err := pgx.Connect(ctx, URL())
	if err != nil {
		return "", unreachable(err)
	}
	defer admin.Close(context.Background())

	const lockKey = 7_002_001 // any constant shared by every test binary
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return "", fmt.Errorf("take template lock: %w", err)
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", lockKey) //nolint:errcheck

	var ready bool
	err = admin.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", name).Scan(&ready)
	switch {
	case err == nil && ready:
		return name, nil
	case err == nil:
		// A half-built template from an interrupted run.
		if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			return "", fmt.Errorf("drop unfinished template %s: %w", name, err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return "", fmt.Errorf("look up template %s: %w", name, err)
	}

	dropStaleTemplates(ctx, admin, name)

	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s", pgx.Identifier{name}.Sanitize())); err != nil {
		return "", fmt.Errorf("create template %s: %w", name, err)
	}
	m, err := migrations.Open(withDatabaseURL(URL(), name))
	if err != nil {
		return "", err
	}
	_, err = m.Up(ctx)
	m.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template %s: %w", name, err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s WITH is_template = true ALLOW_CONNECTIONS = false", pgx.Identifier{name}.Sanitize())); err != nil {
		return "", fmt.Errorf("mark template %s: %w", name, err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("COMMENT ON DATABASE %s IS 'outbox test template built at %s'",
		pgx.Identifier{name}.Sanitize(), time.Now().UTC().Format(time.RFC3339))); err != nil {
		return "", fmt.Errorf("mark template %s: %w", name, err)
	}
	return name, nil
}

// staleTemplateAge is how long a template of another migration set is
// kept: two checkouts with different migrations (a branch beside main) may
// run their tests on one server at the same time, and neither may drop the
// template the other is copying from.
const staleTemplateAge = 2 * time.Hour

// dropStaleTemplates removes templates built from other migration sets more
// than staleTemplateAge ago (the build time is the database's comment).
func dropStaleTemplates(ctx context.Context, admin *pgx.Conn, keep string) {
	rows, err := admin.Query(ctx, `
		SELECT datname FROM pg_database
		WHERE datname LIKE 'outbox\_tmpl\_%' AND datname <> $1
		  AND coalesce(substring(shobj_description(oid, 'pg_database') FROM 'built at (\S+)'), '-infinity')::timestamptz
		      < now() - make_interval(secs => $2)`, keep, staleTemplateAge.Seconds())
	if err != nil {
		return
	}
	names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	for _, n := range names {
		_, _ = admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s WITH is_template = false", pgx.Identifier{n}.Sanitize()))
		_, _ = admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s", pgx.Identifier{n}.Sanitize()))
	}
}

func migrationsHash() (string, error) {
	fsys := migrations.FS()
	var names []string
	if err := fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			names = append(names, path)
		}
		return nil
	}); err != nil {
		return "", fmt.Errorf("read migrations: %w", err)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func dropDatabase(t testing.TB, name string) {
	if os.Getenv("OUTBOX_TEST_KEEP_DATABASES") != "" {
		t.Logf("pgtest: kept database %s", name)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, URL())
	if err != nil {
		t.Logf("pgtest: drop %s: %v", name, err)
		return
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
		t.Logf("pgtest: drop %s: %v", name, err)
	}
}

func withDatabase(t testing.TB, base, name string) string {
	t.Helper()
	u := withDatabaseURL(base, name)
	if u == "" {
		t.Fatalf("pgtest: OUTBOX_TEST_DATABASE_URL must be a postgres:// URL, got %q", redact(base))
	}
	return u
}

func withDatabaseURL(base, name string) string {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return ""
	}
	u.Path = "/" + name
	return u.String()
}

func redact(connString string) string {
	u, err := url.Parse(connString)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}

func randomSuffix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return strings.ToLower(hex.EncodeToString(b[:]))
}
