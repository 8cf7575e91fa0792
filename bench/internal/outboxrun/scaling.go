package outboxrun

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/bench/internal/latency"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
)

// ClaimScalingResult is the claim (and completion) latency at one queue
// depth and archive size.
type ClaimScalingResult struct {
	Pending  int
	Archive  int
	Claim    latency.Summary
	Complete latency.Summary
	// Load is how long filling the tables took (not part of the figure).
	Load time.Duration
}

// insertPendingSQL fills outbox.pending as enqueue_batch would: uuid v7 ids
// in creation order, a dedupe key each, the workload's payload, due now.
const insertPendingSQL = `INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, payload)
SELECT outbox.uuid_v7(), $1, $2, 'tenant-' || (g % 16), 'tenant-' || (g % 16) || '/turn-' || g || '/req-1', $3::jsonb
FROM generate_series($4::bigint, $5::bigint) g`

// insertArchiveSQL appends DISPATCHED attempts of messages long gone, with
// message ids in time order as uuid v7 makes them.
const insertArchiveSQL = `INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic,
                             tenant_id, dedupe_key, target, target_ref, latency_ms, created_at)
SELECT (lpad(to_hex(1700000000000 + g), 12, '0') || '7000' || '8000' || lpad(to_hex(g), 12, '0'))::uuid,
       1, 'DISPATCHED', 'archive-loader', $1, $2, 'tenant-' || (g % 16),
       'tenant-' || (g % 16) || '/turn-' || g || '/req-1', 'routes[0]', 'evt-' || g, 3,
       timestamptz '2026-01-01 00:00:00+00' + g * interval '1 ms'
FROM generate_series($3::bigint, $4::bigint) g`

// fill loads n rows with sql (arguments: namespace, topic, [payload], from,
// to) over parallel connections, each its own slice of the range, with
// synchronous_commit off: a bulk load, not part of any figure.
func fill(ctx context.Context, db *scratch.DB, sql string, n, parallel int, payload []byte) error {
	const chunk = 250_000
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	next := make(chan [2]int64)
	go func() {
		defer close(next)
		for from := 1; from <= n; from += chunk {
			select {
			case next <- [2]int64{int64(from), int64(min(n, from+chunk-1))}:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range parallel {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, db.URL)
			if err == nil {
				defer conn.Close(context.Background())
				_, err = conn.Exec(ctx, "SET synchronous_commit = off")
			}
			for r := range next {
				if err != nil {
					continue
				}
				args := []any{Namespace, Topic}
				if payload != nil {
					args = append(args, string(payload))
				}
				_, err = conn.Exec(ctx, sql, append(args, r[0], r[1])...)
			}
			if err != nil {
				mu.Lock()
				firstErr = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return firstErr
}

// Depth is one queue state of the claim scaling figure.
type Depth struct {
	Pending int
	Archive int
}

// ClaimScaling measures ClaimBatch of batchSize at steady queue depths:
// each depth gets its own database, filled before any measurement. Each
// cycle claims a batch (timed), completes it as dispatched (timed) and
// enqueues a fresh batch at the tail with EnqueueBatch, so that the depth
// stays put and the head of the queue sees the churn it sees in
// production. The depths take their cycles in turn, so that whatever else
// the machine does at the time weighs on all of them alike. warmup cycles
// run first and are not counted.
func ClaimScaling(ctx context.Context, srv *scratch.Server, spec workload.Spec, depths []Depth, batchSize, warmup, cycles int) ([]ClaimScalingResult, error) {
	payload := workload.Payload(spec.PayloadBytes)
	type state struct {
		res               ClaimScalingResult
		pool              *pgxpool.Pool
		store             *lease.Store
		claims, completes []time.Duration
		next              int
	}
	states := make([]*state, len(depths))
	defer func() {
		for _, st := range states {
			if st != nil && st.pool != nil {
				st.pool.Close()
			}
		}
	}()
	for i, d := range depths {
		db, err := srv.CreateMigrated(ctx, fmt.Sprintf("claim_%d_%d", d.Pending, d.Archive))
		if err != nil {
			return nil, err
		}
		defer db.Drop()
		st := &state{res: ClaimScalingResult{Pending: d.Pending, Archive: d.Archive}, next: d.Pending + 1}
		states[i] = st
		began := time.Now()
		if err := fill(ctx, db, insertPendingSQL, d.Pending, 2, payload); err != nil {
			return nil, fmt.Errorf("fill pending: %w", err)
		}
		if d.Archive > 0 {
			// The append-only trigger fires on UPDATE, DELETE and TRUNCATE
			// only: a superuser's INSERT ... SELECT needs no exemption.
			if err := fill(ctx, db, insertArchiveSQL, d.Archive, 2, nil); err != nil {
				return nil, fmt.Errorf("fill archive: %w", err)
			}
		}
		if err := db.Exec(ctx, "VACUUM ANALYZE outbox.pending", "VACUUM ANALYZE outbox.attempts", "CHECKPOINT"); err != nil {
			return nil, err
		}
		st.res.Load = time.Since(began)
		if st.pool, err = db.Pool(ctx, 1); err != nil {
			return nil, err
		}
		st.store = lease.NewStore(st.pool)
	}

	refill := make([]outbox.Message, batchSize)
	for i := range warmup + cycles {
		for _, st := range states {
			for j := range refill {
				k := st.next + j
				refill[j] = outbox.Message{Namespace: Namespace, Topic: Topic, TenantID: fmt.Sprintf("tenant-%d", k%16),
					DedupeKey: fmt.Sprintf("tenant-%d/turn-%d/req-1", k%16, k), Payload: payload}
			}
			start := time.Now()
			msgs, err := st.store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "scaling", BatchSize: batchSize, Lease: 5 * time.Minute})
			claimed := time.Since(start)
			if err != nil {
				return nil, err
			}
			if len(msgs) != min(batchSize, st.res.Pending) {
				return nil, fmt.Errorf("claim returned %d messages at depth %d", len(msgs), st.res.Pending)
			}
			start = time.Now()
			if _, err := st.store.CompleteBatch(ctx, "scaling", dispatched(msgs)); err != nil {
				return nil, err
			}
			completed := time.Since(start)
			if _, err := outbox.EnqueueBatch(ctx, st.pool, refill[:len(msgs)]); err != nil {
				return nil, err
			}
			st.next += len(msgs)
			if i >= warmup {
				st.claims = append(st.claims, claimed)
				st.completes = append(st.completes, completed)
			}
		}
	}
	out := make([]ClaimScalingResult, len(states))
	for i, st := range states {
		st.res.Claim, st.res.Complete = latency.Summarise(st.claims), latency.Summarise(st.completes)
		out[i] = st.res
	}
	return out, nil
}

func dispatched(msgs []lease.Message) []lease.Result {
	out := make([]lease.Result, len(msgs))
	for i, m := range msgs {
		out[i] = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: lease.Dispatched, Target: "routes[0]"}
	}
	return out
}
