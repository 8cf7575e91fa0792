// Package riverrun measures River (github.com/riverqueue/river), a
// PostgreSQL job queue, on the comparison's workload: the jobs are inserted
// with InsertManyFast, then one client works them with no-op workers, set up
// as River's own riverbench command sets it up (2,000 workers,
// a 2 ms fetch cooldown and a 20 ms poll interval).
package riverrun

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
)

// InsertBatchSize is the jobs per InsertManyFast call, as the outbox's
// enqueue batch.
const InsertBatchSize = 1000

// Workers is the queue's MaxWorkers.
const Workers = 2000

// Result is River's run.
type Result struct {
	Jobs          int
	Insert, Work  time.Duration
	InsertBatches int
}

// InsertRate and WorkRate are jobs per second.
func (r Result) InsertRate() float64 { return float64(r.Jobs) / r.Insert.Seconds() }
func (r Result) WorkRate() float64   { return float64(r.Jobs) / r.Work.Seconds() }

// args is a job whose encoded arguments are exactly the workload's payload.
type args struct{ payload json.RawMessage }

func (args) Kind() string                    { return "bench_noop" }
func (a args) MarshalJSON() ([]byte, error)  { return a.payload, nil }
func (a *args) UnmarshalJSON(b []byte) error { a.payload = append(a.payload[:0], b...); return nil }

type noopWorker struct{ river.WorkerDefaults[args] }

func (noopWorker) Work(context.Context, *river.Job[args]) error { return nil }

// Run migrates River's schema into db, inserts the jobs, then works them
// all and times both phases. Work is timed from the client's Start to the
// last completion event.
func Run(ctx context.Context, db *scratch.DB, spec workload.Spec) (Result, error) {
	// pgxpool's default size on this machine (max(4, cores)), as a River
	// user gets without tuning.
	pool, err := db.Pool(ctx, max(4, runtime.NumCPU()))
	if err != nil {
		return Result{}, err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return Result{}, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return Result{}, fmt.Errorf("river: migrate: %w", err)
	}

	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{})
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Logger:            logger,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: Workers}},
		Workers:           workers,
	})
	if err != nil {
		return Result{}, err
	}

	payload := workload.Payload(spec.PayloadBytes)
	batches := make([][]river.InsertManyParams, 0, spec.Messages/InsertBatchSize+1)
	for from := 0; from < spec.Messages; from += InsertBatchSize {
		b := make([]river.InsertManyParams, 0, InsertBatchSize)
		for i := from; i < min(spec.Messages, from+InsertBatchSize); i++ {
			b = append(b, river.InsertManyParams{Args: args{payload: payload}})
		}
		batches = append(batches, b)
	}
	res := Result{Jobs: spec.Messages, InsertBatches: len(batches)}
	start := time.Now()
	for _, b := range batches {
		if _, err := client.InsertManyFast(ctx, b); err != nil {
			return Result{}, fmt.Errorf("river: insert: %w", err)
		}
	}
	res.Insert = time.Since(start)
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE river_job"); err != nil {
		return Result{}, err
	}

	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: spec.Messages + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer cancel()
	start = time.Now()
	if err := client.Start(ctx); err != nil {
		return Result{}, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()
	done, last := 0, start
	timeout := time.NewTimer(5 * time.Minute)
	defer timeout.Stop()
	for done < spec.Messages {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				return Result{}, fmt.Errorf("river: job %d ended %s", ev.Job.ID, ev.Kind)
			}
			done++
			last = time.Now()
		case <-timeout.C:
			return Result{}, fmt.Errorf("river: only %d of %d jobs completed in 5 minutes", done, spec.Messages)
		}
	}
	res.Work = last.Sub(start)
	var left int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state <> 'completed'").Scan(&left); err != nil {
		return Result{}, err
	}
	if left != 0 {
		return Result{}, fmt.Errorf("river: %d jobs not completed", left)
	}
	return res, nil
}
