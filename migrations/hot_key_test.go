package migrations_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// Completing a run of a hot key reads the key's indexes as far as the run,
// not through everything the key delivered before: with autovacuum off (so
// that nothing cleans the delivered messages' index entries), the
// completion of 1,000 messages after 21,000 were drained reads about as
// many pages of the key's sequence index as the first. Counted in buffer hits, which a slow
// machine does not change.
func TestAHotKeysCompletionDoesNotGrowWithItsDrainedBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE outbox.pending SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	for range 23 {
		if _, err := db.Pool.Exec(ctx, `SELECT count(*) FROM outbox.enqueue_batch(
			array_fill('billing'::text, ARRAY[1000]), array_fill('usage'::text, ARRAY[1000]),
			array_fill('{"tokens": 12}'::text, ARRAY[1000]), p_ordering_keys => array_fill('tenant-hot'::text, ARRAY[1000]))`); err != nil {
			t.Fatal(err)
		}
	}
	conn := pgtest.Connect(t, db.URL)
	// cycle claims the key's next run and completes it, and answers the
	// buffer hits the completion made on the key's messages in sequence
	// order (pending_key_sequence: where the next head is found).
	cycle := func() int64 {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT id, lease_token FROM outbox.claim_batch(1000, 'w', 60, NULL, 1000)`)
		if err != nil {
			t.Fatal(err)
		}
		type claimedRow struct{ ID, Token uuid.UUID }
		claimed, err := pgx.CollectRows(rows, pgx.RowToStructByPos[claimedRow])
		if err != nil || len(claimed) != 1000 {
			t.Fatalf("claimed %d messages (%v), want a run of 1,000", len(claimed), err)
		}
		ids, tokens := make([]uuid.UUID, len(claimed)), make([]uuid.UUID, len(claimed))
		for i, c := range claimed {
			ids[i], tokens[i] = c.ID, c.Token
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		hits := func() int64 {
			var n int64
			if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_blocks_hit('outbox.pending_key_sequence'::regclass)`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := hits()
		var notOK int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox.complete_batch('w', NULL, 100, true, $1, $2,
			array_fill('DISPATCHED'::text, ARRAY[1000]))`, ids, tokens).Scan(&notOK); err != nil || notOK != 0 {
			t.Fatalf("completion: %d not ok (%v)", notOK, err)
		}
		after := hits()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return after - before
	}
	first := cycle()
	for range 20 {
		cycle()
	}
	later := cycle()
	if later > 2*first+50 {
		t.Fatalf("completing 1,000 messages of the hot key read %d index pages after 21,000 were drained, %d after 0: "+
			"it walks what the key delivered before", later, first)
	}
	t.Logf("index buffer hits of a completion: %d at first, %d after 21,000 drained", first, later)
}
