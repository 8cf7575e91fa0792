// Package migrations holds the outbox schema as plain versioned SQL files,
// embedded in every binary that needs them, and applies them with goose.
//
// The files are the source of truth for the database state machine; see
// 00002_outbox_functions.sql for the transitions and their SQLSTATEs.
// Applied versions are recorded in public.outbox_schema_migrations, so the
// outbox can share a database with the application that produces into it.
// A PostgreSQL advisory lock serialises concurrent migrators.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// VersionTable records the applied migrations.
const VersionTable = "public.outbox_schema_migrations"

//go:embed *.sql
var files embed.FS

// FS is the embedded migration files, for tools that want to read them.
func FS() embed.FS { return files }

// Result is what one migration run did.
type Result struct {
	Version  int64
	Source   string
	Duration string
}

// Status is one migration's state in a database.
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
// theirs (shared/pgconn: a URL, a Secrets Manager secret or RDS IAM
// authentication) — and takes it over: Close closes it.
func OpenPool(pool *pgxpool.Pool) (*Migrator, error) {
	return open(stdlib.OpenDBFromPool(pool), pool)
}

func open(db *sql.DB, pool *pgxpool.Pool) (*Migrator, error) {
	closeAll := func() {
		db.Close()
		if pool != nil {
			pool.Close()
		}
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("migrations: advisory lock: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithTableName(VersionTable),
		goose.WithSessionLocker(locker),
	)
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return &Migrator{db: db, provider: provider, pool: pool}, nil
}

// DB is the migrator's database, for what a tool checks before migrating
// (outboxctl migrate down counts the messages a rollback would drop).
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

// Up applies every migration not yet applied. Running it again is a no-op.
func (m *Migrator) Up(ctx context.Context) ([]Result, error) {
	results, err := m.provider.Up(ctx)
	return convert(results), wrap("up", err)
}

// Down rolls back the most recent migration.
func (m *Migrator) Down(ctx context.Context) ([]Result, error) {
	result, err := m.provider.Down(ctx)
	if err != nil {
		if errors.Is(err, goose.ErrNoNextVersion) {
			return nil, nil
		}
		return nil, wrap("down", err)
	}
	return convert([]*goose.MigrationResult{result}), nil
}

// DownTo rolls back every migration above version (0 removes the outbox).
func (m *Migrator) DownTo(ctx context.Context, version int64) ([]Result, error) {
	results, err := m.provider.DownTo(ctx, version)
	return convert(results), wrap("down", err)
}

// Status lists every embedded migration and whether it is applied.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	states, err := m.provider.Status(ctx)
	if err != nil {
		return nil, wrap("status", err)
	}
	out := make([]Status, 0, len(states))
	for _, s := range states {
		out = append(out, Status{Version: s.Source.Version, Source: s.Source.Path, Applied: s.State == goose.StateApplied})
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
