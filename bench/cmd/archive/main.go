// Command archive measures the attempts archive at volume: it builds an
// archive of -rows rows over -days days (one partition a day, rows written
// straight into the partitions, not through the dispatcher), then prints
//
//   - what retention costs to purge one day: the outbox.purge pass that
//     detaches the day's partition (the archive locked) and the next, that
//     drops its table (ms, medians over -purge-days days), beside the same day's
//     rows deleted row by row in batches of -purge-rows (outbox.forget_attempts,
//     as purge deletes in DEFAULT and as it deleted every day before the
//     archive was partitioned);
//
//   - what PostgreSQL's backend spends per message on the engine's claim and
//     completion with that archive and with an empty one, and their ratio
//     (bench/internal/callcost, the measurement of cmd/callcost);
//
//   - the bytes on disk per million archived rows (pg_total_relation_size
//     over the partitions, indexes and TOAST included).
//
//     go run ./cmd/archive                  # from bench/: 50,000,000 rows (about 10 GB), on a throwaway cluster with autovacuum on
//     go run ./cmd/archive -rows 5000000    # the quick run
//     go run ./cmd/archive -cluster host    # on the server at -database-url instead
//
// PostgreSQL must run on this machine (callcost reads the backend's /proc
// entry). It prints figures, and fails only if the database does.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/callcost"
	"github.com/outboxkit/dispatcher/bench/internal/outboxrun"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "archive:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		target    = scratch.TargetFlags()
		rows      = flag.Int("rows", 50_000_000, "archived rows to build, spread evenly over -days days ending today")
		days      = flag.Int("days", 30, "days the archive spans (one partition each)")
		purgeDays = flag.Int("purge-days", 5, "oldest days purged one by one, partition by partition")
		purgeRows = flag.Int("purge-rows", 10_000, "rows per call of the row-by-row purge (the reaper's OUTBOX_PURGE_MAX_ROWS default)")
		messages  = flag.Int("messages", 20_000, "messages in the queue each claim-and-completion round drains")
		batch     = flag.Int("batch", 1000, "claim batch size")
		rounds    = flag.Int("rounds", 3, "claim-and-completion rounds per archive, each on a fresh copy (0: skip that measurement)")
	)
	flag.Parse()
	if *rows < *days || *days < *purgeDays+2 || *purgeDays < 1 || *rounds < 0 {
		return fmt.Errorf("-rows %d, -days %d, -purge-days %d, -rounds %d: want at least a row a day, two days more than are purged, and rounds not negative",
			*rows, *days, *purgeDays, *rounds)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	srv, stopCluster, err := target.Open(ctx)
	if err != nil {
		return err
	}
	defer stopCluster()
	fmt.Println(target.Describe())

	full, err := srv.CreateMigrated(ctx, "archive_full")
	if err != nil {
		return err
	}
	defer full.Drop()
	start := time.Now()
	if err := build(ctx, full, *rows, *days); err != nil {
		return err
	}
	fmt.Printf("built an archive of %d rows over %d days in %s\n", *rows, *days, time.Since(start).Round(time.Second))
	perMillion, total, err := bytesPerMillion(ctx, full, *rows)
	if err != nil {
		return err
	}
	fmt.Printf("on disk: %.1f MB over the partitions, %.1f MB per million archived rows\n", float64(total)/1e6, perMillion/1e6)

	if *rounds > 0 {
		if err := claimAndCompletion(ctx, srv, full, *messages, *batch, *rounds); err != nil {
			return err
		}
	}

	detached, dropped, err := purgeByPartition(ctx, full, *days, *purgeDays)
	if err != nil {
		return err
	}
	rowByRow, calls, err := purgeRowByRow(ctx, full, *days, *purgeDays, *purgeRows)
	if err != nil {
		return err
	}
	fmt.Printf("purge of one day (%d rows): the pass detaching it %.1f ms (median of %d days: %s), the archive locked;\n"+
		"  the next pass dropping its table %.1f ms (%s), the archive not locked; row by row %.0f ms (%d calls of %d rows)\n",
		*rows / *days, median(detached), len(detached), formatMs(detached), median(dropped), formatMs(dropped), rowByRow, calls, *purgeRows)
	return nil
}

// claimAndCompletion prints the engine's server CPU per message on its
// claims and completions with the full archive and with an empty one.
func claimAndCompletion(ctx context.Context, srv *scratch.Server, full *scratch.DB, messages, batch, rounds int) error {
	empty, err := srv.CreateMigrated(ctx, "archive_empty")
	if err != nil {
		return err
	}
	defer empty.Drop()
	for _, db := range []*scratch.DB{full, empty} {
		if _, err := outboxrun.Enqueue(ctx, db, workload.Spec{Messages: messages, PayloadBytes: 512}, true); err != nil {
			return err
		}
		if err := db.Exec(ctx, "VACUUM ANALYZE outbox.pending", "CHECKPOINT"); err != nil {
			return err
		}
	}
	costs := map[string]callcostFigures{}
	for _, c := range []struct {
		name string
		db   *scratch.DB
	}{{"empty", empty}, {"full", full}} {
		rs, err := callcost.Run(ctx, srv, c.db.Name, batch, rounds, "")
		if err != nil {
			return err
		}
		costs[c.name] = callcostFigures{
			claim:    callcost.Summarise(rs, func(r callcost.Round) float64 { return r.Engine.PerMessage(r.Engine.Claim) }).Median,
			complete: callcost.Summarise(rs, func(r callcost.Round) float64 { return r.Engine.PerMessage(r.Engine.Complete) }).Median,
		}
	}
	fmt.Printf("engine's server CPU per message, µs (median of %d rounds of %d messages, batch %d):\n", rounds, messages, batch)
	fmt.Printf("%-9s %12s %12s %8s\n", "", "empty", "archive", "ratio")
	for _, f := range []struct {
		name string
		get  func(callcostFigures) float64
	}{{"claim", func(c callcostFigures) float64 { return c.claim }}, {"complete", func(c callcostFigures) float64 { return c.complete }},
		{"both", func(c callcostFigures) float64 { return c.claim + c.complete }}} {
		e, a := f.get(costs["empty"]), f.get(costs["full"])
		fmt.Printf("%-9s %12.2f %12.2f %8.3f\n", f.name, e, a, a/e)
	}
	return nil
}

type callcostFigures struct{ claim, complete float64 }

// dayExpr is SQL for the date daysAgo days before today (UTC).
func dayExpr(daysAgo int) string {
	return fmt.Sprintf("((now() AT TIME ZONE 'UTC')::date - %d)", daysAgo)
}

// boundExpr is SQL for the UUIDv7 of 00:00 UTC on the date d: a partition
// bound (migrations/functions/ensure_archive_partitions.sql).
func boundExpr(d string) string {
	return fmt.Sprintf("(lpad(to_hex((extract(epoch FROM (%s)::timestamp AT TIME ZONE 'UTC') * 1000)::bigint), 12, '0') || repeat('0', 20))::uuid", d)
}

// build writes rows archived attempts over the days ending today: a
// partition a day (as ensure_archive_partitions makes them), its share of
// the rows inserted straight into it, message ids UUIDv7s spread over the
// day (today's up to a minute ago), nine in ten DISPATCHED and one in ten
// RETRYABLE, half with a dedupe key. Then VACUUM ANALYZE, as autovacuum
// would leave an archive that old.
func build(ctx context.Context, db *scratch.DB, rows, days int) error {
	pool, err := db.Pool(ctx, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	perDay := rows / days
	var next int64
	for ago := days - 1; ago >= 0; ago-- {
		n := perDay
		if ago == 0 {
			n = rows - perDay*(days-1)
		}
		day := dayExpr(ago)
		var name string
		if err := pool.QueryRow(ctx, `SELECT 'attempts_p' || to_char(`+day+`, 'YYYYMMDD')`).Scan(&name); err != nil {
			return err
		}
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass('outbox.' || $1) IS NOT NULL`, name).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			for _, stmt := range []string{
				fmt.Sprintf(`CREATE TABLE outbox.%s PARTITION OF outbox.attempts FOR VALUES FROM (%s) TO (%s)`, name, boundExpr(day), boundExpr(day+" + 1")),
				`ALTER TABLE outbox.` + name + ` OWNER TO outbox_owner`,
				`CREATE TRIGGER attempts_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON outbox.` + name +
					` FOR EACH STATEMENT EXECUTE FUNCTION outbox.attempts_append_only()`,
			} {
				if _, err := pool.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("%s: %w", stmt, err)
				}
			}
		}
		// The day's span in milliseconds: all of it, or today's up to a
		// minute ago.
		insert := fmt.Sprintf(`
			WITH span AS (
				SELECT (extract(epoch FROM (%[1]s)::timestamp AT TIME ZONE 'UTC') * 1000)::bigint AS t0,
				       greatest(least(86400000, (extract(epoch FROM now() - interval '1 minute') * 1000)::bigint
				                        - (extract(epoch FROM (%[1]s)::timestamp AT TIME ZONE 'UTC') * 1000)::bigint), 1000) AS ms
			)
			INSERT INTO outbox.%[2]s (id, message_id, attempt_no, state, worker_id, namespace, topic, tenant_id, dedupe_key,
			                          target, target_ref, error_code, error_message, latency_ms, created_at)
			SELECT $1 + g,
			       (lpad(to_hex(m.at), 12, '0') || '7' || lpad(to_hex(g %% 4096), 3, '0') || '8' || lpad(to_hex(g), 15, '0'))::uuid,
			       CASE WHEN g %% 10 = 0 THEN 1 ELSE 0 END,
			       CASE WHEN g %% 10 = 0 THEN 'RETRYABLE' ELSE 'DISPATCHED' END,
			       'dispatch-' || (g %% 8),
			       'billing', 'usage.recorded', 'tenant-' || (g %% 1000),
			       CASE WHEN g %% 2 = 0 THEN 'usage-' || g END,
			       'eventbridge:default',
			       CASE WHEN g %% 10 <> 0 THEN md5(g::text) END,
			       CASE WHEN g %% 10 = 0 THEN 'THROTTLED' END,
			       CASE WHEN g %% 10 = 0 THEN 'ThrottlingException: rate exceeded' END,
			       20 + g %% 80,
			       to_timestamp((m.at + 40 + g %% 80) / 1000.0)
			FROM span, generate_series(1, $2::bigint) g
			CROSS JOIN LATERAL (SELECT span.t0 + g * span.ms / ($2::bigint + 1) AS at) m`, day, name)
		if _, err := pool.Exec(ctx, insert, next, n); err != nil {
			return fmt.Errorf("fill %s: %w", name, err)
		}
		next += int64(n)
	}
	if _, err := pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence('outbox.attempts', 'id'), $1)`, next); err != nil {
		return err
	}
	return db.Exec(ctx, "VACUUM ANALYZE outbox.attempts", "CHECKPOINT")
}

// bytesPerMillion is the archive's size on disk over its partitions, per
// million rows, and in all.
func bytesPerMillion(ctx context.Context, db *scratch.DB, rows int) (float64, int64, error) {
	pool, err := db.Pool(ctx, 1)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	var total int64
	if err := pool.QueryRow(ctx, `SELECT sum(pg_total_relation_size(i.inhrelid))::bigint FROM pg_inherits i
		WHERE i.inhparent = 'outbox.attempts'::regclass`).Scan(&total); err != nil {
		return 0, 0, err
	}
	return float64(total) / (float64(rows) / 1e6), total, nil
}

// purgeByPartition purges the oldest purgeDays days one by one, each with
// the retention that makes exactly that day expire, and returns the time
// of each pass that detached a day (the archive locked) and of each that
// dropped the day detached before (the archive not locked), in
// milliseconds.
func purgeByPartition(ctx context.Context, db *scratch.DB, days, purgeDays int) (detach, drop []float64, err error) {
	pool, err := db.Pool(ctx, 1)
	if err != nil {
		return nil, nil, err
	}
	defer pool.Close()
	partitions := func() (int, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox.attempts'::regclass`).Scan(&n)
		return n, err
	}
	pass := func(next string) (float64, error) {
		start := time.Now()
		_, err := pool.Exec(ctx, `SELECT * FROM outbox.purge(now() - ((`+next+`)::timestamp AT TIME ZONE 'UTC'), NULL, 10000)`)
		return float64(time.Since(start).Microseconds()) / 1000, err
	}
	for k := range purgeDays {
		next := dayExpr(days - 2 - k) // the day after the one to drop: its 00:00 is the cutoff
		before, err := partitions()
		if err != nil {
			return nil, nil, err
		}
		// A pass drops the day detached before, if any, and detaches
		// nothing more; then a pass detaches this day.
		for range 2 {
			ms, err := pass(next)
			if err != nil {
				return nil, nil, err
			}
			after, err := partitions()
			if err != nil {
				return nil, nil, err
			}
			if after == before-1 {
				detach = append(detach, ms)
				break
			}
			drop = append(drop, ms)
		}
		if after, _ := partitions(); after != before-1 {
			return nil, nil, fmt.Errorf("purge of day %d left %d partitions of %d, want one fewer", k+1, after, before)
		}
	}
	ms, err := pass(dayExpr(days - 1 - purgeDays))
	if err != nil {
		return nil, nil, err
	}
	return detach, append(drop, ms), nil
}

// purgeRowByRow deletes the next day's rows as retention deletes rows in
// DEFAULT (and deleted every day before the archive was partitioned): in
// calls of batch rows, each selecting the expired rows purge may take and
// handing them to forget_attempts. It returns the total in milliseconds
// and the calls it took.
func purgeRowByRow(ctx context.Context, db *scratch.DB, days, purgeDays, batch int) (float64, int, error) {
	pool, err := db.Pool(ctx, 1)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	day := dayExpr(days - 1 - purgeDays)
	var name string
	if err := pool.QueryRow(ctx, `SELECT 'outbox.attempts_p' || to_char(`+day+`, 'YYYYMMDD')`).Scan(&name); err != nil {
		return 0, 0, err
	}
	stmt := `SELECT outbox.forget_attempts(coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.message_id), '{}'))
		FROM (SELECT o.id, o.message_id FROM ` + name + ` o
		      WHERE o.created_at < ((` + day + ` + 1)::timestamp AT TIME ZONE 'UTC') + interval '1 minute'
		        AND o.state NOT IN ('REPLAYED', 'DISCARDED', 'RESCHEDULED')
		        AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id OFFSET 0)
		        AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id OFFSET 0)
		      LIMIT $1) x`
	var total time.Duration
	calls := 0
	for {
		var n int64
		start := time.Now()
		if err := pool.QueryRow(ctx, stmt, batch).Scan(&n); err != nil {
			return 0, 0, err
		}
		total += time.Since(start)
		calls++
		if n == 0 {
			break
		}
	}
	return float64(total.Microseconds()) / 1000, calls, nil
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func formatMs(xs []float64) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%.1f", x)
	}
	return out
}
