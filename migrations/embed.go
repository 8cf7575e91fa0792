// Package migrations holds the outbox schema, embedded in every binary that
// needs it, and applies it.
//
// Two kinds of files:
//
//   - Versioned migrations (NNNNN_name.sql at the top of this folder),
//     applied once each, in order, by goose: tables, indexes, roles, grants,
//     and the DROPs a function's change of signature needs. 00001_baseline.sql
//     is the whole schema as of the first release; later changes are new
//     files.
//   - Function files (functions/NAME.sql): the current definition of each
//     SQL function, the only legal writers of the outbox. Each file holds one
//     function (CREATE OR REPLACE), the grants of who may call it, and for a
//     trigger function its trigger. They are applied after the versioned
//     migrations, in one transaction, as the schema's owner; a file whose
//     checksum is recorded in outbox.function_sources is not applied again.
//     A function's history is the git log of its file.
//   - Fragments (functions/fragments/NAME.sql): a condition that several
//     statements share and that must cost nothing to share, such as the
//     lease fence. A function file names one as ${NAME}; the migrator puts
//     the fragment's text there before applying the file (the checksum is
//     the expanded text's). PostgreSQL inlines no SQL function that holds a
//     subquery, and the fence has one: a call per row would cost more than
//     the statement it guards.
//
// Goose has no repeatable migrations, which is what the function files are
// (as in Flyway's R__ files): the migrator applies them itself, under the
// advisory lock goose's own migrators take, so that concurrent migrators
// (and older binaries) are serialised with it.
//
// Applied versions are recorded in public.outbox_schema_migrations, so the
// outbox can share a database with the application that produces into it.
// docs/DATABASE.md describes the schema and the state machine.
package migrations

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// VersionTable records the applied migrations.
const VersionTable = "public.outbox_schema_migrations"

// FunctionsDir is the folder of the function files, inside FS.
const FunctionsDir = "functions"

// FragmentsDir is the folder of the fragments function files include.
const FragmentsDir = FunctionsDir + "/fragments"

// placeholder is a fragment's name in a function file: ${name}.
var placeholder = regexp.MustCompile(`\$\{([a-z_]+)\}`)

//go:embed *.sql functions/*.sql functions/fragments/*.sql
var files embed.FS

// FS is the embedded migration files, for tools that want to read them.
func FS() embed.FS { return files }

// ErrPreReleaseDatabase is returned by Up for a database whose outbox was
// built by the pre-release migrations 00002-00011, which the baseline
// replaced.
var ErrPreReleaseDatabase = errors.New("migrations: the database's outbox was built by a pre-release build")

// Result is what one migration run did: a versioned migration applied or
// rolled back, or a function file applied (Version 0).
type Result struct {
	Version  int64
	Source   string
	Duration string
}

// Status is one migration's state in a database: a versioned migration, or
// a function file (Version 0), which is applied when the database holds
// its current checksum.
type Status struct {
	Version int64
	Source  string
	Applied bool
}

// Migrator applies the embedded migrations to one database.
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
	// pool, when the migrator was opened on one, is closed with it.
	pool *pgxpool.Pool
}

// Open connects to databaseURL (a PostgreSQL URL or key=value string) and
// prepares a migrator. Close it when done.
func Open(databaseURL string) (*Migrator, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("migrations: parse database URL: %w", err)
	}
	return open(stdlib.OpenDB(*cfg), nil)
}

// OpenPool prepares a migrator on pool — one built as the functions build
// theirs (shared/dbpool: a URL, a Secrets Manager secret or RDS IAM
// authentication) — and takes it over: Close closes it.
func OpenPool(pool *pgxpool.Pool) (*Migrator, error) {
	return open(stdlib.OpenDBFromPool(pool), pool)
}

func open(db *sql.DB, pool *pgxpool.Pool) (*Migrator, error) {
	versioned, err := fs.Sub(files, ".")
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	// The lock is the migrator's own (see lockSchema), around the versioned
	// migrations and the function files together.
	provider, err := goose.NewProvider(goose.DialectPostgres, db, versioned, goose.WithTableName(VersionTable))
	if err != nil {
		db.Close()
		if pool != nil {
			pool.Close()
		}
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return &Migrator{db: db, provider: provider, pool: pool}, nil
}

// DB is the migrator's database, for what a tool checks before migrating
// (outboxctl migrate down counts what a rollback would drop).
func (m *Migrator) DB() *sql.DB { return m.db }

// Close releases the migrator's connections (and the pool it was opened
// on).
func (m *Migrator) Close() error {
	err := m.db.Close()
	if m.pool != nil {
		m.pool.Close()
	}
	return err
}

// Up applies every versioned migration not yet applied, then every function
// file whose checksum the database does not hold. Running it again is a
// no-op.
func (m *Migrator) Up(ctx context.Context) ([]Result, error) {
	var results []Result
	err := m.locked(ctx, func(conn *sql.Conn) error {
		if err := m.refusePreRelease(ctx); err != nil {
			return err
		}
		applied, err := m.provider.Up(ctx)
		results = convert(applied)
		if err != nil {
			return wrap("up", err)
		}
		functions, err := applyFunctions(ctx, conn)
		results = append(results, functions...)
		return err
	})
	return results, err
}

// Down rolls back the most recent versioned migration.
func (m *Migrator) Down(ctx context.Context) ([]Result, error) {
	var results []Result
	err := m.locked(ctx, func(conn *sql.Conn) error {
		result, err := m.provider.Down(ctx)
		if err != nil {
			if errors.Is(err, goose.ErrNoNextVersion) {
				return nil
			}
			return wrap("down", err)
		}
		results = convert([]*goose.MigrationResult{result})
		return forgetFunctions(ctx, conn)
	})
	return results, err
}

// DownTo rolls back every versioned migration above version (0 removes the
// outbox).
func (m *Migrator) DownTo(ctx context.Context, version int64) ([]Result, error) {
	var results []Result
	err := m.locked(ctx, func(conn *sql.Conn) error {
		rolledBack, err := m.provider.DownTo(ctx, version)
		results = convert(rolledBack)
		if err != nil {
			return wrap("down", err)
		}
		return forgetFunctions(ctx, conn)
	})
	return results, err
}

// Status lists every embedded versioned migration and function file and
// whether it is applied.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	states, err := m.provider.Status(ctx)
	if err != nil {
		return nil, wrap("status", err)
	}
	out := make([]Status, 0, len(states))
	for _, s := range states {
		out = append(out, Status{Version: s.Source.Version, Source: s.Source.Path, Applied: s.State == goose.StateApplied})
	}
	recorded, err := recordedFunctions(ctx, m.db)
	if err != nil {
		return nil, wrap("status", err)
	}
	sources, err := functionSources()
	if err != nil {
		return nil, err
	}
	for _, f := range sources {
		out = append(out, Status{Source: f.file, Applied: recorded[f.file] == f.sha256})
	}
	return out, nil
}

// Latest is the highest embedded migration version.
func (m *Migrator) Latest() int64 {
	sources := m.provider.ListSources()
	if len(sources) == 0 {
		return 0
	}
	return sources[len(sources)-1].Version
}

// migrationLockID is goose's own advisory lock id, so that a migrator of an
// older build, which let goose take it, waits for this one and the other way
// round.
const migrationLockID = lock.DefaultLockID

// locked runs fn holding the migration lock on a connection of its own.
func (m *Migrator) locked(ctx context.Context, fn func(conn *sql.Conn) error) error {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrations: connect: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", migrationLockID); err != nil {
		return fmt.Errorf("migrations: take the migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the caller's may be done, and the lock must go.
		unlockCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(unlockCtx, "SELECT pg_advisory_unlock($1)", migrationLockID)
	}()
	return fn(conn)
}

// preReleaseVersions are the versions of the pre-release migrations that
// 00001_baseline.sql replaced.
const firstPreReleaseVersion, lastPreReleaseVersion = 2, 11

// refusePreRelease stops Up on a database that records a pre-release
// migration: its schema is not the baseline's, and applying on top of it
// would mix the two.
func (m *Migrator) refusePreRelease(ctx context.Context) error {
	var exists bool
	if err := m.db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, VersionTable).Scan(&exists); err != nil {
		return wrap("up", err)
	}
	if !exists {
		return nil
	}
	var version sql.NullInt64
	err := m.db.QueryRowContext(ctx,
		`SELECT max(version_id) FROM `+VersionTable+` WHERE is_applied AND version_id BETWEEN $1 AND $2`,
		firstPreReleaseVersion, lastPreReleaseVersion).Scan(&version)
	if err != nil {
		return wrap("up", err)
	}
	if !version.Valid {
		return nil
	}
	return fmt.Errorf("%w (it records migration %05d of the pre-release series 00001-%05d, which one baseline replaced): "+
		"drain it, remove it with that build's `outboxctl migrate down --to 0`, and run `migrate up` again",
		ErrPreReleaseDatabase, version.Int64, lastPreReleaseVersion)
}

// functionFile is one embedded function file.
type functionFile struct {
	file   string // functions/NAME.sql
	name   string // NAME: the function it defines
	sql    string
	sha256 string
}

func functionSources() ([]functionFile, error) {
	fragments, err := readFragments()
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(files, FunctionsDir+"/*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: list function files: %w", err)
	}
	sort.Strings(names)
	out := make([]functionFile, 0, len(names))
	for _, n := range names {
		b, err := fs.ReadFile(files, n)
		if err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", n, err)
		}
		text, err := expand(n, string(b), fragments)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256([]byte(text))
		out = append(out, functionFile{
			file:   n,
			name:   strings.TrimSuffix(path.Base(n), ".sql"),
			sql:    text,
			sha256: hex.EncodeToString(sum[:]),
		})
	}
	return out, nil
}

// FunctionSQL is the SQL the migrator applies for function file name
// (functions/name.sql) with its fragments in place; a fragment named in
// override is replaced by the text given, for tests that swap a broken
// piece of the state machine in (the lease fence) and show it is caught.
func FunctionSQL(name string, override map[string]string) (string, error) {
	fragments, err := readFragments()
	if err != nil {
		return "", err
	}
	for k, v := range override {
		if _, ok := fragments[k]; !ok {
			return "", fmt.Errorf("migrations: no fragment %q to override", k)
		}
		fragments[k] = v
	}
	file := FunctionsDir + "/" + name + ".sql"
	b, err := fs.ReadFile(files, file)
	if err != nil {
		return "", fmt.Errorf("migrations: %w", err)
	}
	return expand(file, string(b), fragments)
}

// readFragments is the fragments by name, each without its leading comment
// lines (which say what it is for) and trailing newline.
func readFragments() (map[string]string, error) {
	names, err := fs.Glob(files, FragmentsDir+"/*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: list fragments: %w", err)
	}
	fragments := map[string]string{}
	for _, n := range names {
		b, err := fs.ReadFile(files, n)
		if err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", n, err)
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		for len(lines) > 0 && strings.HasPrefix(lines[0], "--") {
			lines = lines[1:]
		}
		fragments[strings.TrimSuffix(path.Base(n), ".sql")] = strings.Join(lines, "\n")
	}
	return fragments, nil
}

// expand puts each fragment a function file names in its place.
func expand(file, text string, fragments map[string]string) (string, error) {
	var missing []string
	out := placeholder.ReplaceAllStringFunc(text, func(m string) string {
		name := placeholder.FindStringSubmatch(m)[1]
		fragment, ok := fragments[name]
		if !ok {
			missing = append(missing, name)
			return m
		}
		return fragment
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("migrations: %s names fragment(s) %s, which %s does not hold", file, strings.Join(missing, ", "), FragmentsDir)
	}
	return out, nil
}

// recordedFunctions is outbox.function_sources: file -> checksum (empty
// without a schema).
func recordedFunctions(ctx context.Context, q querier) (map[string]string, error) {
	var exists bool
	if err := q.QueryRowContext(ctx, `SELECT to_regclass('outbox.function_sources') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, err
	}
	recorded := map[string]string{}
	if !exists {
		return recorded, nil
	}
	rows, err := q.QueryContext(ctx, `SELECT file, sha256 FROM outbox.function_sources`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var file, sum string
		if err := rows.Scan(&file, &sum); err != nil {
			return nil, err
		}
		recorded[file] = sum
	}
	return recorded, rows.Err()
}

// querier is what recordedFunctions reads with: the database, or a
// transaction.
type querier interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

// applyFunctions applies, in one transaction and as the schema's owner,
// every function file whose checksum the database does not hold or whose
// function is missing; then drops what no file defines any more: a
// function no file is named after, and an overload a file no longer
// creates (the file changed the function's parameters). Function bodies
// are not checked at creation (as pg_dump restores them), so the files'
// order does not matter; each is checked when first called.
func applyFunctions(ctx context.Context, conn *sql.Conn) ([]Result, error) {
	sources, err := functionSources()
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := conn.QueryRowContext(ctx, `SELECT to_regnamespace('outbox') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, wrap("functions", err)
	}
	if !exists {
		return nil, nil // no schema: nothing applied yet (or all rolled back)
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return nil, wrap("functions", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit, a no-op
	if _, err := tx.ExecContext(ctx, `SET LOCAL ROLE outbox_owner; SET LOCAL check_function_bodies = off`); err != nil {
		return nil, wrap("functions", err)
	}
	recorded, err := recordedFunctions(ctx, tx)
	if err != nil {
		return nil, wrap("functions", err)
	}
	present := map[string]bool{}
	rows, err := tx.QueryContext(ctx, `SELECT DISTINCT p.proname FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace`)
	if err != nil {
		return nil, wrap("functions", err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, wrap("functions", err)
		}
		present[name] = true
	}
	rows.Close()

	var results, applied []string
	var durations []time.Duration
	for _, f := range sources {
		if recorded[f.file] == f.sha256 && present[f.name] {
			continue
		}
		start := time.Now()
		if _, err := tx.ExecContext(ctx, f.sql); err != nil {
			return nil, fmt.Errorf("migrations: apply %s: %w", f.file, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO outbox.function_sources (file, sha256) VALUES ($1, $2)
			ON CONFLICT (file) DO UPDATE SET sha256 = excluded.sha256, applied_at = now()`, f.file, f.sha256); err != nil {
			return nil, wrap("functions", err)
		}
		results = append(results, f.file)
		applied = append(applied, f.name)
		durations = append(durations, time.Since(start))
	}
	if len(applied) == 0 {
		return nil, tx.Commit()
	}
	known := make([]string, 0, len(sources))
	for _, f := range sources {
		known = append(known, f.name)
	}
	// Stale: named by no file, or an overload of a function applied now that
	// this transaction did not create or replace (its row's xmin is older).
	stale, err := tx.QueryContext(ctx, `
		SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
		WHERE p.pronamespace = 'outbox'::regnamespace
		  AND (NOT p.proname = ANY ($1::text[])
		       OR (p.proname = ANY ($2::text[]) AND p.xmin::text <> (txid_current() % 4294967296)::text))`,
		known, applied)
	if err != nil {
		return nil, wrap("functions: find stale functions", err)
	}
	var drop []string
	for stale.Next() {
		var signature string
		if err := stale.Scan(&signature); err != nil {
			stale.Close()
			return nil, wrap("functions", err)
		}
		drop = append(drop, signature)
	}
	stale.Close()
	for _, signature := range drop {
		// signature is a regprocedure's own text: quoted as PostgreSQL quotes it.
		if _, err := tx.ExecContext(ctx, "DROP FUNCTION "+signature); err != nil {
			return nil, fmt.Errorf("migrations: drop %s, which no function file defines: %w", signature, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, wrap("functions", err)
	}
	out := make([]Result, len(results))
	for i, r := range results {
		out[i] = Result{Source: r, Duration: durations[i].String()}
	}
	return out, nil
}

// forgetFunctions clears the record of applied function files after a
// rollback, so that the next Up applies every file again: the functions
// must match the schema the rollback left.
func forgetFunctions(ctx context.Context, conn *sql.Conn) error {
	_, err := conn.ExecContext(ctx, `
		DO $$
		BEGIN
		    IF to_regclass('outbox.function_sources') IS NOT NULL THEN
		        DELETE FROM outbox.function_sources;
		    END IF;
		END;
		$$`)
	return wrap("down", err)
}

func convert(results []*goose.MigrationResult) []Result {
	out := make([]Result, 0, len(results))
	for _, r := range results {
		if r == nil || r.Source == nil {
			continue
		}
		out = append(out, Result{Version: r.Source.Version, Source: r.Source.Path, Duration: r.Duration.String()})
	}
	return out
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("migrations: %s: %w", op, err)
}
