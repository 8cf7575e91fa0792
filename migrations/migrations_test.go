package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/migrations"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// outboxTables is how many tables the migrations create in schema outbox.
const outboxTables = 12

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
	if len(applied) == 0 || applied[len(applied)-1].Version != m.Latest() {
		t.Fatalf("first up applied %v, want every migration up to %d", applied, m.Latest())
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
			t.Fatalf("migration %d not applied after up", s.Version)
		}
	}

	conn := pgtest.Connect(t, url)
	objects := func() (tables, functions int) {
		conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'outbox'`).Scan(&tables)
		conn.QueryRow(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'outbox'`).Scan(&functions)
		return
	}
	if tables, functions := objects(); tables != outboxTables || functions < 9 {
		t.Fatalf("after up: %d tables, %d functions in schema outbox", tables, functions)
	}
	var reloptions []string
	if err := conn.QueryRow(ctx, `SELECT reloptions FROM pg_class WHERE oid = 'outbox.pending'::regclass`).Scan(&reloptions); err != nil || len(reloptions) == 0 {
		t.Fatalf("outbox.pending has no per-table autovacuum settings: %v %v", reloptions, err)
	}

	// Down to the last released migration and up again: a Down half that
	// left behind anything its Up half creates makes the second Up fail.
	if _, err := m.DownTo(ctx, 4); err != nil {
		t.Fatalf("down to 4: %v", err)
	}
	if again, err := m.Up(ctx); err != nil || len(again) != int(m.Latest()-4) {
		t.Fatalf("up from 4 applied %v (%v), want every migration after 4", again, err)
	}

	if _, err := m.DownTo(ctx, 0); err != nil {
		t.Fatalf("down: %v", err)
	}
	var schemas int
	conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'`).Scan(&schemas)
	if schemas != 0 {
		t.Fatal("schema outbox survived the down migrations")
	}
	// And back up again from nothing.
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up after down: %v", err)
	}
	if tables, _ := objects(); tables != outboxTables {
		t.Fatalf("after up, down, up: %d tables", tables)
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
	if n != len(status) {
		t.Fatalf("%d migration records, want each of the %d migrations once", n, len(status))
	}
}
