package migrations_test

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/migrations"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// outboxTables is how many tables the migrations create in schema outbox,
// not counting the archive's partitions (they come and go by day): 14 in
// the baseline, breakers and rate_limits in 00013; 00014 partitions
// outbox.attempts, which stays one table.
const outboxTables = 16

// archivePartitions is how many partitions a new archive has: DEFAULT, and
// today and the three days after it.
const archivePartitions = 1 + 4

// migratedEmpty is a new database with every migration applied: its
// migrator, closed with the test, and a connection to it.
func migratedEmpty(t *testing.T) (*migrations.Migrator, *pgx.Conn) {
	t.Helper()
	url := pgtest.NewEmpty(t)
	m, err := migrations.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m, pgtest.Connect(t, url)
}

func TestUpTwiceIsANoOpAndDownRemovesEverything(t *testing.T) {
	t.Parallel()
	url := pgtest.NewEmpty(t)
	ctx := context.Background()
	m, err := migrations.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	applied, err := m.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	versions, functionFiles := 0, 0
	for _, r := range applied {
		if r.Version > 0 {
			versions++
		} else {
			functionFiles++
		}
	}
	if versions == 0 || functionFiles == 0 || applied[versions-1].Version != m.Latest() {
		t.Fatalf("first up applied %v, want every migration up to %d, then every function file", applied, m.Latest())
	}
	again, err := m.Up(ctx)
	if err != nil || len(again) != 0 {
		t.Fatalf("second up applied %v (%v), want nothing", again, err)
	}
	status, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range status {
		if !s.Applied {
			t.Fatalf("%s not applied after up", s.Source)
		}
	}

	conn := pgtest.Connect(t, url)
	objects := func() (tables, functions int) {
		conn.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relnamespace = 'outbox'::regnamespace AND relkind IN ('r', 'p') AND NOT relispartition`).Scan(&tables)
		var partitions int
		conn.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox.attempts'::regclass`).Scan(&partitions)
		if partitions != archivePartitions {
			t.Errorf("the archive has %d partitions, want %d (DEFAULT, today and 3 days ahead)", partitions, archivePartitions)
		}
		conn.QueryRow(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'outbox'`).Scan(&functions)
		return
	}
	if tables, functions := objects(); tables != outboxTables || functions != functionFiles {
		t.Fatalf("after up: %d tables, %d functions in schema outbox, want %d and one per function file (%d)",
			tables, functions, outboxTables, functionFiles)
	}
	var reloptions []string
	if err := conn.QueryRow(ctx, `SELECT reloptions FROM pg_class WHERE oid = 'outbox.pending'::regclass`).Scan(&reloptions); err != nil || len(reloptions) == 0 {
		t.Fatalf("outbox.pending has no per-table autovacuum settings: %v %v", reloptions, err)
	}

	if _, err := m.DownTo(ctx, 0); err != nil {
		t.Fatalf("down: %v", err)
	}
	var schemas int
	conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'`).Scan(&schemas)
	if schemas != 0 {
		t.Fatal("schema outbox survived the down migrations")
	}
	// And back up again from nothing: a Down half that left behind
	// anything its Up half creates makes the second Up fail, and the
	// function files are applied again, since the rollback forgot them.
	again, err = m.Up(ctx)
	if err != nil {
		t.Fatalf("up after down: %v", err)
	}
	if len(again) != len(applied) {
		t.Fatalf("up after down applied %d migrations and function files, want %d as the first time", len(again), len(applied))
	}
	if tables, functions := objects(); tables != outboxTables || functions != functionFiles {
		t.Fatalf("after up, down, up: %d tables, %d functions", tables, functions)
	}
}

func TestConcurrentMigratorsSerialise(t *testing.T) {
	t.Parallel()
	url := pgtest.NewEmpty(t)
	ctx := context.Background()
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			m, err := migrations.Open(url)
			if err != nil {
				errs <- err
				return
			}
			defer m.Close()
			_, err = m.Up(ctx)
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent up: %v", err)
		}
	}
	conn := pgtest.Connect(t, url)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{"public", "outbox_schema_migrations"}.Sanitize()+` WHERE version_id > 0`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	m, err := migrations.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	status, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	versions := 0
	for _, s := range status {
		if s.Version > 0 {
			versions++
		}
	}
	if n != versions {
		t.Fatalf("%d migration records, want each of the %d migrations once", n, versions)
	}
}

// A function file is applied again only when it changed or its function is
// missing; a function no file defines any more, or an overload its file no
// longer creates, is dropped with the next change.
func TestFunctionFilesApplyWhenChangedOrMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, conn := migratedEmpty(t)
	for _, stmt := range []string{
		// stats.sql as if it had changed since it was applied
		`UPDATE outbox.function_sources SET sha256 = 'changed' WHERE file = 'functions/stats.sql'`,
		// a function whose file is gone, and a stale overload of stats
		`CREATE FUNCTION outbox.obsolete() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
		`CREATE FUNCTION outbox.stats(p_old int) RETURNS int LANGUAGE sql AS 'SELECT 1'`,
		// a function dropped by hand
		`DROP FUNCTION outbox.pauses()`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	status, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range status {
		if s.Source == "functions/stats.sql" && s.Applied {
			t.Fatal("status says functions/stats.sql is applied while the database holds another checksum")
		}
	}
	applied, err := m.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, r := range applied {
		files = append(files, r.Source)
	}
	if strings.Join(files, " ") != "functions/pauses.sql functions/stats.sql" {
		t.Fatalf("up applied %v, want the changed stats.sql and the missing pauses.sql only", files)
	}
	var left []string
	rows, err := conn.Query(ctx, `SELECT p.oid::regprocedure::text FROM pg_proc p
		WHERE p.pronamespace = 'outbox'::regnamespace AND p.proname IN ('obsolete', 'stats', 'pauses') ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var sig string
		rows.Scan(&sig)
		left = append(left, sig)
	}
	if strings.Join(left, " ") != "outbox.pauses() outbox.stats()" {
		t.Fatalf("functions after up: %v, want outbox.pauses() and outbox.stats() alone", left)
	}
	var owner string
	if err := conn.QueryRow(ctx, `SELECT pg_get_userbyid(proowner) FROM pg_proc WHERE oid = 'outbox.pauses()'::regprocedure`).Scan(&owner); err != nil || owner != "outbox_owner" {
		t.Fatalf("re-created outbox.pauses() is owned by %q (%v), want outbox_owner", owner, err)
	}
}

// Every SQL function of the outbox has one home: a file of its own in
// functions/, named after it, and no versioned migration defines one.
func TestEveryFunctionHasOneHome(t *testing.T) {
	t.Parallel()
	create := regexp.MustCompile(`(?im)^\s*CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+outbox\.(\w+)\s*\(`)
	fsys := migrations.FS()
	versioned, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range versioned {
		b, _ := fs.ReadFile(fsys, f)
		if m := create.FindAllStringSubmatch(string(b), -1); len(m) > 0 {
			t.Errorf("%s defines function outbox.%s: functions live in functions/<name>.sql", f, m[0][1])
		}
	}
	files, err := fs.Glob(fsys, migrations.FunctionsDir+"/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no function files (%v)", err)
	}
	for _, f := range files {
		b, _ := fs.ReadFile(fsys, f)
		m := create.FindAllStringSubmatch(string(b), -1)
		want := strings.TrimSuffix(path.Base(f), ".sql")
		if len(m) != 1 || m[0][1] != want {
			t.Errorf("%s creates %v, want exactly one function, outbox.%s", f, m, want)
		}
	}
}

// A database built by the pre-release migrations (00002-00011, which the
// baseline replaced) is refused, not migrated on top of.
func TestPreReleaseDatabaseIsRefused(t *testing.T) {
	t.Parallel()
	url := pgtest.NewEmpty(t)
	ctx := context.Background()
	conn := pgtest.Connect(t, url)
	if _, err := conn.Exec(ctx, `CREATE TABLE public.outbox_schema_migrations (
		id serial PRIMARY KEY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp DEFAULT now());
		INSERT INTO public.outbox_schema_migrations (version_id, is_applied) SELECT v, true FROM generate_series(0, 11) v`); err != nil {
		t.Fatal(err)
	}
	m, err := migrations.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, err = m.Up(ctx)
	if !errors.Is(err, migrations.ErrPreReleaseDatabase) || !strings.Contains(err.Error(), "00011") {
		t.Fatalf("up on a pre-release database: %v, want ErrPreReleaseDatabase naming 00011", err)
	}
	var schemas int
	conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'`).Scan(&schemas)
	if schemas != 0 {
		t.Fatal("up created schema outbox on a refused database")
	}
}
