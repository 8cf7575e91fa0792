package sink_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/sink"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

func count(t *testing.T, pool *pgxpool.Pool, query string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// TestPostgresDeduperCommitsWithTheHandlersWrites is the exactly-once
// receiver: the handler's ledger row and the webhook-id commit together or
// not at all.
func TestPostgresDeduperCommitsWithTheHandlersWrites(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA plugin; CREATE TABLE plugin.ledger (webhook_id text, amount int)`); err != nil {
		t.Fatal(err)
	}
	d, err := sink.NewPostgresDeduper(ctx, db.Pool, "plugin.webhook_dedupe")
	if err != nil {
		t.Fatal(err)
	}
	var failAfterWrite atomic.Bool
	h := func(ctx context.Context, env publish.Envelope) error {
		tx, ok := sink.Tx(ctx)
		if !ok {
			return errors.New("no transaction in the handler's context")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO plugin.ledger VALUES ($1, 100)`, env.Key); err != nil {
			return err
		}
		if failAfterWrite.Load() {
			return errors.New("failed after writing")
		}
		return nil
	}
	url := serve(t, sink.NewReceiver(testSecret, d, h, quiet))
	del := newDelivery(t, publishtest.Message(0, 64))

	failAfterWrite.Store(true)
	if got := send(t, del.request(t, url)); got.status != http.StatusInternalServerError {
		t.Fatalf("failing handler: %d %v, want 500", got.status, got.answer)
	}
	if n, ids := count(t, db.Pool, `SELECT count(*) FROM plugin.ledger`), count(t, db.Pool, `SELECT count(*) FROM plugin.webhook_dedupe`); n != 0 || ids != 0 {
		t.Fatalf("after a failure: %d ledger rows, %d ids; want neither", n, ids)
	}

	failAfterWrite.Store(false)
	if got := send(t, del.request(t, url)); got.status != http.StatusOK || got.duplicate {
		t.Fatalf("retry: %d %v, want 200 delivered", got.status, got.answer)
	}
	if got := send(t, del.request(t, url)); got.status != http.StatusOK || !got.duplicate {
		t.Fatalf("redelivery: %d %v, want 200 duplicate", got.status, got.answer)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM plugin.ledger`); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
	var id string
	var receivedAt time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT webhook_id, received_at FROM plugin.webhook_dedupe`).Scan(&id, &receivedAt); err != nil {
		t.Fatal(err)
	}
	if id != del.id || time.Since(receivedAt) > time.Minute {
		t.Errorf("recorded %q at %s", id, receivedAt)
	}
}

func TestPostgresDeduperConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	d, err := sink.NewPostgresDeduper(t.Context(), db.Pool, "webhook_dedupe")
	if err != nil {
		t.Fatal(err)
	}
	testConcurrentDuplicates(t, d)
}

func TestPostgresDeduperSetupAndPurge(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()

	// Receivers starting together both get a deduper on one table.
	var wg sync.WaitGroup
	dedupers := make([]*sink.PostgresDeduper, 4)
	for i := range dedupers {
		wg.Go(func() {
			d, err := sink.NewPostgresDeduper(ctx, db.Pool, "dedupe")
			if err != nil {
				t.Errorf("concurrent setup: %v", err)
			}
			dedupers[i] = d
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	d := dedupers[0]
	for _, id := range []string{"old", "new"} {
		_, delivery, err := d.Begin(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := delivery.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE dedupe SET received_at = now() - interval '8 days' WHERE webhook_id = 'old'`); err != nil {
		t.Fatal(err)
	}
	purged, err := d.Purge(ctx, 7*24*time.Hour)
	if err != nil || purged != 1 {
		t.Fatalf("Purge: %d, %v; want 1", purged, err)
	}
	if _, _, err := d.Begin(ctx, "new"); !errors.Is(err, sink.ErrDuplicate) {
		t.Errorf("the recent id was purged: %v", err)
	}
	if _, err := d.Purge(ctx, 0); err == nil {
		t.Error("Purge(0) would delete everything")
	}

	for _, bad := range []string{"", "a.b.c", ".x", "x."} {
		if _, err := sink.NewPostgresDeduper(ctx, db.Pool, bad); err == nil {
			t.Errorf("table %q accepted", bad)
		}
	}
}

func TestDeduperUnavailableIsRetryable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool, err := pgxpool.New(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	d, err := sink.NewPostgresDeduper(t.Context(), pool, "dedupe")
	if err != nil {
		t.Fatal(err)
	}
	pool.Close() // the database is gone
	c := &counter{}
	url := serve(t, sink.NewReceiver(testSecret, d, c.handle, quiet))
	got := send(t, newDelivery(t, publishtest.Message(0, 64)).request(t, url))
	if got.status != http.StatusServiceUnavailable || c.count() != 0 {
		t.Errorf("answer %d %v, handler runs %d; want 503 and no run", got.status, got.answer, c.count())
	}
}
