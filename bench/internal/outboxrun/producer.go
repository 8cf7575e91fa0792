package outboxrun

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/bench/internal/latency"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// ProducerResult is the cost of one Enqueue inside a producer's
// transaction.
type ProducerResult struct {
	// Without and With are the transaction's latency without and with the
	// Enqueue.
	Without, With latency.Summary
	// RoundTripsWithout and RoundTripsWith are the wire round trips of one
	// transaction, once the connection's statements are prepared;
	// RoundTripsFirstUse is a transaction with the Enqueue on a connection
	// that has never run it.
	RoundTripsWithout, RoundTripsWith, RoundTripsFirstUse int64
}

// AddedP50 and AddedP99 are what the Enqueue adds at each percentile.
func (r ProducerResult) AddedP50() time.Duration { return r.With.P50 - r.Without.P50 }
func (r ProducerResult) AddedP99() time.Duration { return r.With.P99 - r.Without.P99 }

// AddedRoundTrips is what the Enqueue adds once prepared.
func (r ProducerResult) AddedRoundTrips() int64 { return r.RoundTripsWith - r.RoundTripsWithout }

// ProducerTx measures a business transaction — BEGIN, a compare-and-set
// UPDATE of one row, COMMIT — with and without one outbox.Enqueue in it,
// alternating the two so that both see the same machine. It counts the
// round trips of each on the wire (shared/testkit/pgtest.RoundTrips).
func ProducerTx(ctx context.Context, srv *scratch.Server, spec workload.Spec, samples int) (ProducerResult, error) {
	var res ProducerResult
	db, err := srv.CreateMigrated(ctx, "producer")
	if err != nil {
		return res, err
	}
	defer db.Drop()
	if err := db.Exec(ctx,
		`CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, version bigint NOT NULL, updated_at timestamptz NOT NULL)`,
		`INSERT INTO orders SELECT g, 'open', 0, now() FROM generate_series(1, 10000) g`,
		`VACUUM ANALYZE orders`); err != nil {
		return res, err
	}
	var trips pgtest.RoundTrips
	pool, err := db.Pool(ctx, 1, func(c *pgxpool.Config) { trips.Install(c) })
	if err != nil {
		return res, err
	}
	defer pool.Close()
	payload := workload.Payload(spec.PayloadBytes)

	seq := 0
	tx := func(enqueue bool) (time.Duration, int64, error) {
		seq++
		id := seq%10000 + 1
		trips.Reset()
		start := time.Now()
		t, err := pool.Begin(ctx)
		if err != nil {
			return 0, 0, err
		}
		defer t.Rollback(ctx)
		var version int64
		if err := t.QueryRow(ctx, `UPDATE orders SET status = $2, version = version + 1, updated_at = now()
			WHERE id = $1 RETURNING version`, id, fmt.Sprintf("paid-%d", seq)).Scan(&version); err != nil {
			return 0, 0, err
		}
		if enqueue {
			if _, err := outbox.Enqueue(ctx, t, outbox.Message{Namespace: Namespace, Topic: "order_paid",
				TenantID: "tenant-42", DedupeKey: fmt.Sprintf("order-%d/v%d", id, version), Payload: payload}); err != nil {
				return 0, 0, err
			}
		}
		if err := t.Commit(ctx); err != nil {
			return 0, 0, err
		}
		return time.Since(start), trips.Count(), nil
	}

	// The first transaction of each kind prepares its statements on the
	// connection: count it, then leave it out of the latencies.
	if _, res.RoundTripsWithout, err = tx(false); err != nil {
		return res, err
	}
	if _, res.RoundTripsFirstUse, err = tx(true); err != nil {
		return res, err
	}
	var without, with []time.Duration
	for i := range 2 * samples {
		d, n, err := tx(i%2 == 1)
		if err != nil {
			return res, err
		}
		if i%2 == 1 {
			with = append(with, d)
			res.RoundTripsWith = n
		} else {
			without = append(without, d)
			res.RoundTripsWithout = n
		}
	}
	res.Without, res.With = latency.Summarise(without), latency.Summarise(with)
	return res, nil
}
