// Command hotkeydrain measures what completing a batch of one hot ordering
// key costs as the key's delivered backlog grows: the key's messages are
// claimed in runs of -batch and completed, and the completion's time
// (median of a few batches) is printed after 0 messages drained and at each
// -at mark, with its ratio to the first. A completion whose cost grows with
// what was delivered before it walks dead index entries it should not.
//
//	go run ./cmd/hotkeydrain                         # from bench/, on a throwaway cluster with autovacuum on
//	go run ./cmd/hotkeydrain -cluster host           # on the server at -database-url instead of a cluster of its own
//
// It prints figures and the server's autovacuum setting; it fails only if
// the database does.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/bench/internal/scratch"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hotkeydrain:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		server  = scratch.TargetFlags()
		total   = flag.Int("messages", 300000, "messages of the one key")
		batch   = flag.Int("batch", 1000, "messages per claim and completion")
		samples = flag.Int("samples", 5, "batches timed at each mark")
		marks   = flag.String("at", "0,50000,100000,200000,290000", "messages drained before each measurement")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	srv, stopCluster, err := server.Open(ctx)
	if err != nil {
		return err
	}
	defer stopCluster()
	fmt.Println(server.Describe())
	db, err := srv.CreateMigrated(ctx, "hotkeydrain")
	if err != nil {
		return err
	}
	defer db.Drop()
	pool, err := db.Pool(ctx, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	var autovacuum string
	if err := pool.QueryRow(ctx, `SHOW autovacuum`).Scan(&autovacuum); err != nil {
		return err
	}
	fmt.Printf("hot key of %d messages, batches of %d; autovacuum=%s\n", *total, *batch, autovacuum)

	for start := 0; start < *total; start += 10000 {
		n := min(10000, *total-start)
		if _, err := pool.Exec(ctx, `SELECT count(*) FROM outbox.enqueue_batch(
			array_fill('billing'::text, ARRAY[$1::int]), array_fill('usage'::text, ARRAY[$1::int]),
			array_fill('{"tokens": 12, "note": "a usage snapshot of the hot key"}'::text, ARRAY[$1::int]),
			p_ordering_keys => array_fill('tenant-hot'::text, ARRAY[$1::int]))`, n); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox.pending`); err != nil {
		return err
	}

	var at []int
	for _, s := range strings.Split(*marks, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-at: %w", err)
		}
		at = append(at, v)
	}
	drained := 0
	var first time.Duration
	for _, mark := range at {
		for drained < mark {
			if _, n, err := cycle(ctx, pool, *batch); err != nil {
				return err
			} else if n == 0 {
				return fmt.Errorf("the key ran out at %d messages drained", drained)
			} else {
				drained += n
			}
		}
		var times []time.Duration
		for range *samples {
			d, n, err := cycle(ctx, pool, *batch)
			if err != nil {
				return err
			}
			drained += n
			times = append(times, d)
		}
		sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
		median := times[len(times)/2]
		if first == 0 {
			first = median
		}
		fmt.Printf("after %7d drained: completion of %d %8.2f ms  ratio %.2f\n", mark, *batch,
			float64(median.Microseconds())/1000, float64(median)/float64(first))
	}
	return nil
}

// cycle claims a run of the hot key and completes it, and answers how long
// the completion took.
func cycle(ctx context.Context, pool *pgxpool.Pool, batch int) (time.Duration, int, error) {
	rows, err := pool.Query(ctx, `SELECT id, lease_token FROM outbox.claim_batch($1, 'w', 60, NULL, $1)`, batch)
	if err != nil {
		return 0, 0, err
	}
	var ids, tokens []uuid.UUID
	for rows.Next() {
		var id, token uuid.UUID
		if err := rows.Scan(&id, &token); err != nil {
			return 0, 0, err
		}
		ids, tokens = append(ids, id), append(tokens, token)
	}
	if err := rows.Err(); err != nil {
		return 0, 0, err
	}
	if len(ids) == 0 {
		return 0, 0, nil
	}
	start := time.Now()
	var notOK int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox.complete_batch('w', NULL, 100, true, $1, $2,
		array_fill('DISPATCHED'::text, ARRAY[$3::int]))`, ids, tokens, len(ids)).Scan(&notOK); err != nil {
		return 0, 0, err
	}
	if notOK != 0 {
		return 0, 0, fmt.Errorf("%d of %d results not ok", notOK, len(ids))
	}
	return time.Since(start), len(ids), nil
}
