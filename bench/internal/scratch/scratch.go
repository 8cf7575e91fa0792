// Package scratch creates and drops the throwaway databases every benchmark
// runs in: one fresh database per system and run, on the one server, so that
// no system sees another's tables, bloat or statistics.
package scratch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/migrations"
	load "github.com/outboxkit/dispatcher/shared/testkit/workload"
)

// Prefix starts the name of every database this package creates, so that
// an interrupted run's leftovers are recognisable (and dropped by Sweep).
const Prefix = "outbox_bench_"

// URLFlag defines the commands' -database-url flag: the superuser URL of
// the server to run on, by default OUTBOX_BENCH_DATABASE_URL, else
// OUTBOX_TEST_DATABASE_URL, else the local server's test database.
func URLFlag() *string {
	url := "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	for _, env := range []string{"OUTBOX_TEST_DATABASE_URL", "OUTBOX_BENCH_DATABASE_URL"} {
		if v := os.Getenv(env); v != "" {
			url = v
		}
	}
	return flag.String("database-url", url, "PostgreSQL superuser URL (it creates and drops "+Prefix+"* databases)")
}

// Server is the PostgreSQL server the benchmarks run on, reached through an
// administrative (superuser) URL.
type Server struct {
	AdminURL string
}

// DB is one scratch database.
type DB struct {
	Name string
	URL  string
	srv  *Server
}

// Create makes an empty database named Prefix+label+random suffix.
func (s *Server) Create(ctx context.Context, label string) (*DB, error) {
	return s.create(ctx, label, "")
}

// CreateFrom makes a database as a copy of template (a database nobody is
// connected to): the cheap way to give several runs identical data.
func (s *Server) CreateFrom(ctx context.Context, label, template string) (*DB, error) {
	return s.create(ctx, label, template)
}

func (s *Server) create(ctx context.Context, label, template string) (*DB, error) {
	name := Prefix + label + "_" + suffix()
	stmt := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		// FILE_COPY copies the files after one checkpoint; WAL_LOG (the
		// PostgreSQL 15 default) would write the whole copy to the WAL.
		stmt += " TEMPLATE " + pgx.Identifier{template}.Sanitize() + " STRATEGY = FILE_COPY"
	}
	if err := s.exec(ctx, stmt); err != nil {
		return nil, fmt.Errorf("scratch: %s: %w", stmt, err)
	}
	// The creating process, so that Sweep leaves the databases of a run
	// still going in another checkout alone.
	comment := fmt.Sprintf("COMMENT ON DATABASE %s IS 'outbox bench pid %d'", pgx.Identifier{name}.Sanitize(), os.Getpid())
	if err := s.exec(ctx, comment); err != nil {
		return nil, fmt.Errorf("scratch: %s: %w", comment, err)
	}
	u, err := url.Parse(s.AdminURL)
	if err != nil {
		return nil, fmt.Errorf("scratch: parse admin URL: %w", err)
	}
	u.Path = "/" + name
	return &DB{Name: name, URL: u.String(), srv: s}, nil
}

// CreateMigrated makes an empty database and applies the outbox migrations.
func (s *Server) CreateMigrated(ctx context.Context, label string) (*DB, error) {
	db, err := s.Create(ctx, label)
	if err != nil {
		return nil, err
	}
	m, err := migrations.Open(db.URL)
	if err != nil {
		db.Drop()
		return nil, err
	}
	_, err = m.Up(ctx)
	m.Close()
	if err != nil {
		db.Drop()
		return nil, fmt.Errorf("scratch: migrate %s: %w", db.Name, err)
	}
	return db, nil
}

// Drop removes the database, ending any session still connected to it.
func (db *DB) Drop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = db.srv.exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db.Name}.Sanitize()+" WITH (FORCE)")
}

// Pool opens a pool on the database with at most maxConns connections.
func (db *DB) Pool(ctx context.Context, maxConns int, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(maxConns)
	for _, f := range configure {
		f(cfg)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// MeterCPU starts a CPU window on the database's server processes and this
// process (load.CPUMeter); the returned function stops it.
func (db *DB) MeterCPU(ctx context.Context) func() load.CPU {
	admin, err := db.Pool(ctx, 1)
	if err != nil {
		admin = nil // the window then counts this process and the machine only
	}
	m := load.StartCPUMeter(admin, db.Name)
	return func() load.CPU {
		c := m.Stop(ctx, admin, db.Name)
		if admin != nil {
			admin.Close()
		}
		return c
	}
}

// IndexReads is, for each index of outbox.<table> scanned so far, how many
// index entries its scans returned (pg_stat_user_indexes.idx_tup_read):
// what a claim walked over, say, besides what it took. A session's counts
// reach the statistics when it ends, so it waits, up to ten seconds, until
// no client session is connected to the database but its own; call it
// after the run's pools are closed.
func (db *DB) IndexReads(ctx context.Context, table string) (map[string]int64, error) {
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	for deadline := time.Now().Add(10 * time.Second); ; {
		var others int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&others)
		if err != nil {
			return nil, err
		}
		if others == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("index reads of %s: %d other sessions still connected", table, others)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rows, err := conn.Query(ctx, `SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes
		WHERE schemaname = 'outbox' AND relname = $1`, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	reads := map[string]int64{}
	for rows.Next() {
		var index string
		var n int64
		if err := rows.Scan(&index, &n); err != nil {
			return nil, err
		}
		reads[index] = n
	}
	return reads, rows.Err()
}

// Exec runs statements on one fresh connection to the database.
func (db *DB) Exec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// Sweep drops the databases an interrupted earlier run left behind: those
// whose creating process (on this machine) is gone. A run still going in
// another checkout keeps its own.
func (s *Server) Sweep(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `
		SELECT datname, coalesce(substring(shobj_description(oid, 'pg_database') FROM 'outbox bench pid (\d+)')::int, 0)
		FROM pg_database WHERE datname LIKE 'outbox\_bench\_%'`)
	if err != nil {
		return err
	}
	type leftover struct {
		name string
		pid  int
	}
	found, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (leftover, error) {
		var l leftover
		return l, row.Scan(&l.name, &l.pid)
	})
	if err != nil {
		return err
	}
	var names []string
	for _, l := range found {
		if l.pid != 0 && l.pid != os.Getpid() && processAlive(l.pid) {
			continue
		}
		names = append(names, l.name)
	}
	for _, n := range names {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize()+" WITH (FORCE)"); err != nil {
			return err
		}
	}
	return nil
}

// Check connects once, so that a missing server fails the run at once with
// the way to start it.
func (s *Server) Check(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return fmt.Errorf("cannot reach PostgreSQL at %s: %w (start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start)", redacted(s.AdminURL), err)
	}
	return conn.Close(ctx)
}

func (s *Server) exec(ctx context.Context, stmt string) error {
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, stmt)
	return err
}

func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}

func suffix() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// processAlive reports whether a process with this id runs on this machine.
func processAlive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}
