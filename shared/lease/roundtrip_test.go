package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/testkit/pgbouncer"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// ClaimBatch and CompleteBatch must cost one query and one network round
// trip each, whatever the batch size: per-message round trips are what make
// an outbox slow.
func TestClaimAndCompleteAreOneRoundTripEach(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		exec pgx.QueryExecMode
	}{
		{"statement cache", pgx.QueryExecModeCacheStatement},
		{"simple protocol (RDS Proxy)", pgx.QueryExecModeSimpleProtocol},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			queries := &pgtest.QueryCounter{}
			var trips pgtest.RoundTrips
			db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) {
				cfg.MaxConns = 1
				cfg.ConnConfig.Tracer = queries
				cfg.ConnConfig.DefaultQueryExecMode = mode.exec
				trips.Install(cfg)
			})
			ctx := context.Background()
			store := lease.NewStore(db.Pool)
			enqueue(t, db.Pool, 1+1+100+1000, plain)

			// Warm up: a long-lived connection has its statements prepared.
			warm, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.CompleteBatch(ctx, "w", dispatched(warm)); err != nil {
				t.Fatal(err)
			}

			for _, size := range []int{1, 100, 1000} {
				queries.Reset()
				trips.Reset()
				msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: size, Lease: time.Minute})
				if err != nil || len(msgs) != size {
					t.Fatalf("claim %d: %v (%d)", size, err, len(msgs))
				}
				if q, rt := len(queries.Queries()), trips.Count(); q != 1 || rt != 1 {
					t.Errorf("ClaimBatch(%d): %d queries, %d round trips; want 1 and 1", size, q, rt)
				}
				queries.Reset()
				trips.Reset()
				completions, err := store.CompleteBatch(ctx, "w", dispatched(msgs))
				if err != nil || len(completions) != size {
					t.Fatalf("complete %d: %v (%d)", size, err, len(completions))
				}
				if q, rt := len(queries.Queries()), trips.Count(); q != 1 || rt != 1 {
					t.Errorf("CompleteBatch(%d): %d queries, %d round trips; want 1 and 1: %s", size, q, rt, fmt.Sprint(queries.Queries()))
				}
			}
		})
	}
}

// Behind a transaction pooler the statement timeout travels with each
// statement, in the same query string: still one round trip each, through
// a real PgBouncer.
func TestBehindATransactionPoolerClaimAndCompleteAreStillOneRoundTripEach(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var trips pgtest.RoundTrips
	cfg := dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: dbpool.ConnString(pgbouncer.Start(t).URL(t, db.URL)),
		Pooler: dbpool.PoolerTransaction, MaxConns: 1}
	pool, err := dbpool.Open(context.Background(), cfg, dbpool.Deps{ConfigurePool: trips.Install})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	store := lease.NewStore(pool)
	enqueue(t, db.Pool, 100+1000, plain)
	for _, size := range []int{100, 1000} {
		trips.Reset()
		msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: size, Lease: time.Minute})
		if err != nil || len(msgs) != size {
			t.Fatalf("claim %d: %v (%d)", size, err, len(msgs))
		}
		if rt := trips.Count(); rt != 1 {
			t.Errorf("ClaimBatch(%d): %d round trips, want 1", size, rt)
		}
		trips.Reset()
		completions, err := store.CompleteBatch(ctx, "w", dispatched(msgs))
		if err != nil || len(completions) != size {
			t.Fatalf("complete %d: %v (%d)", size, err, len(completions))
		}
		if rt := trips.Count(); rt != 1 {
			t.Errorf("CompleteBatch(%d): %d round trips, want 1", size, rt)
		}
	}
}
