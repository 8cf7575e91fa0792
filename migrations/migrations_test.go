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

// Runs in flight when migration 9 is applied or rolled back — a deployment
// while dispatchers deliver — complete under the lease they were claimed
// with: migration 9 moves a run's lease to its head (run_through) and its
// Down gives each message of the run its lease back. Each message is
// archived once, at attempt 1.
func TestRunsInFlightSurviveMigration9BothWays(t *testing.T) {
	t.Parallel()
	url := pgtest.NewEmpty(t)
	ctx := context.Background()
	m, err := migrations.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, url)
	enqueueAndClaim := func(key string) (ids, tokens []string) {
		t.Helper()
		for i := range 5 {
			if _, err := conn.Exec(ctx, `SELECT * FROM outbox.enqueue('payments', 'captured', jsonb_build_object('n', $2::int), p_ordering_key => $1)`, key, i); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := conn.Query(ctx, `SELECT id::text, lease_token::text FROM outbox.claim_batch(10, 'w', 60, NULL, 10) ORDER BY sequence_id`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, token string
			if err := rows.Scan(&id, &token); err != nil {
				t.Fatal(err)
			}
			ids, tokens = append(ids, id), append(tokens, token)
		}
		if rows.Err() != nil || len(ids) != 5 {
			t.Fatalf("claim of %s: %d messages (%v), want its run of 5", key, len(ids), rows.Err())
		}
		return ids, tokens
	}
	complete := func(key string, ids, tokens []string) {
		t.Helper()
		var notOK int
		if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status <> 'ok') FROM outbox.complete_batch('w', NULL, 100, false,
			$1::uuid[], $2::uuid[], array_fill('DISPATCHED'::text, ARRAY[5]))`, ids, tokens).Scan(&notOK); err != nil || notOK != 0 {
			t.Fatalf("completion of %s's run: %d not ok (%v)", key, notOK, err)
		}
		var archived, first int
		if err := conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE attempt_no = 1) FROM outbox.attempts
			WHERE ordering_key = $1 AND state = 'DISPATCHED'`, key).Scan(&archived, &first); err != nil || archived != 5 || first != 5 {
			t.Fatalf("%s: %d archived, %d at attempt 1 (%v), want 5 and 5", key, archived, first, err)
		}
	}

	// Claimed under migration 9 (the head leased for its run), completed
	// under migration 8 (every message leased).
	ids, tokens := enqueueAndClaim("acct-down")
	if _, err := m.DownTo(ctx, 8); err != nil {
		t.Fatal(err)
	}
	var leased int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox.pending WHERE ordering_key = 'acct-down' AND lease_token IS NOT NULL`).Scan(&leased); err != nil || leased != 5 {
		t.Fatalf("after Down: %d of the run's 5 messages leased (%v)", leased, err)
	}
	complete("acct-down", ids, tokens)

	// Claimed under migration 8, completed under migration 9.
	ids, tokens = enqueueAndClaim("acct-up")
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox.pending WHERE ordering_key = 'acct-up' AND lease_token IS NOT NULL`).Scan(&leased); err != nil || leased != 1 {
		t.Fatalf("after Up: %d of the run's 5 messages hold a lease of their own (%v), want the head alone", leased, err)
	}
	complete("acct-up", ids, tokens)
}
