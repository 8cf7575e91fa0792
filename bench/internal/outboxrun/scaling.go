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
	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/route"
)

// ClaimScalingResult is the claim (and completion) latency at one queue
// depth and archive size.
type ClaimScalingResult struct {
	Pending int
	Archive int
	// Stuck is the backlog queued behind a stuck key's head, and JITOff
	// whether the claims ran with jit off (see Depth).
	Stuck    int
	JITOff   bool
	Claim    latency.Summary
	Complete latency.Summary
	// Load is how long filling the tables took (not part of the figure).
	Load time.Duration
}

// insertPendingSQL fills outbox.pending as enqueue_batch would: uuid v7 ids
// in creation order, a dedupe key each, the workload's payload and its size
// as the producer sent it, due now.
const insertPendingSQL = `INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, payload, payload_bytes)
SELECT outbox.uuid_v7(), $1, $2, 'tenant-' || (g % 16), 'tenant-' || (g % 16) || '/turn-' || g || '/req-1',
       $3::text::jsonb, octet_length($3::text)
FROM generate_series($4::bigint, $5::bigint) g`

// StuckKey is the ordering key of the stuck backlog.
const StuckKey = "stuck-key"

// insertStuckSQL is one ordering key as enqueue_batch and the settling at
// commit would leave it after a producer wrote $5 messages to it while its
// head waited to be retried a year from now (retry_at far ahead, as a
// Retry-After or a long backoff gives): sequence 1 is the key's head (behind
// = false), due in a year; every later message is due now but queued behind
// it (behind = true), so not in the claim's index.
const insertStuckSQL = `INSERT INTO outbox.pending (id, namespace, topic, tenant_id, ordering_key, sequence_id,
                            payload, payload_bytes, behind, available_at, next_attempt_at)
SELECT outbox.uuid_v7(), $1, $2, 'tenant-stuck', '` + StuckKey + `', g, $3::text::jsonb, octet_length($3::text), g > 1,
       CASE WHEN g = 1 THEN now() + interval '1 year' ELSE now() END,
       CASE WHEN g = 1 THEN now() + interval '1 year' ELSE now() END
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
	// Pending unordered messages, due now.
	Pending int
	// Archive attempts of messages long gone.
	Archive int
	// Stuck messages queued behind one ordering key's head, which is
	// scheduled a year ahead: a backlog no claim can take.
	Stuck int
	// JITOff claims on a session with jit = off, a diagnostic: what the
	// claim would cost if the function were not JIT-compiled. It shares
	// the database of the same depth without it (listed earlier), the two
	// taking their cycles in turn on one queue.
	JITOff bool
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
		// next numbers the refill's dedupe keys; states sharing a
		// database share it.
		next *int
	}
	states := make([]*state, len(depths))
	defer func() {
		for _, st := range states {
			if st != nil && st.pool != nil {
				st.pool.Close()
			}
		}
	}()
	type loaded struct {
		db   *scratch.DB
		next *int
	}
	dbs := map[Depth]loaded{}
	for i, d := range depths {
		st := &state{res: ClaimScalingResult{Pending: d.Pending, Archive: d.Archive, Stuck: d.Stuck, JITOff: d.JITOff}}
		states[i] = st
		if d.JITOff {
			base := d
			base.JITOff = false
			l, ok := dbs[base]
			if !ok {
				return nil, fmt.Errorf("depth %+v: JITOff needs the same depth without it earlier in the list", d)
			}
			var err error
			if st.pool, err = l.db.Pool(ctx, 1, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["jit"] = "off" }); err != nil {
				return nil, err
			}
			st.store, st.next = lease.NewStore(st.pool), l.next
			continue
		}
		db, err := srv.CreateMigrated(ctx, fmt.Sprintf("claim_%d_%d_%d", d.Pending, d.Archive, d.Stuck))
		if err != nil {
			return nil, err
		}
		defer db.Drop()
		next := d.Pending + 1
		st.next = &next
		dbs[d] = loaded{db: db, next: &next}
		began := time.Now()
		if d.Stuck > 0 {
			// The stuck key's backlog first, older than the traffic the
			// claims take. Its bookkeeping rows as a producer leaves them.
			if err := fill(ctx, db, insertStuckSQL, d.Stuck+1, 2, payload); err != nil {
				return nil, fmt.Errorf("fill the stuck key: %w", err)
			}
			if err := db.Exec(ctx, fmt.Sprintf(`INSERT INTO outbox.sequences (namespace, ordering_key, last_sequence_id) VALUES ('%s', '%s', %d);
INSERT INTO outbox.keys (namespace, ordering_key) VALUES ('%s', '%s') ON CONFLICT DO NOTHING`, Namespace, StuckKey, d.Stuck+1, Namespace, StuckKey)); err != nil {
				return nil, err
			}
		}
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

	params, err := EngineClaim(batchSize)
	if err != nil {
		return nil, err
	}
	refill := make([]outbox.Message, batchSize)
	for i := range warmup + cycles {
		for _, st := range states {
			for j := range refill {
				k := *st.next + j
				refill[j] = outbox.Message{Namespace: Namespace, Topic: Topic, TenantID: fmt.Sprintf("tenant-%d", k%16),
					DedupeKey: fmt.Sprintf("tenant-%d/turn-%d/req-1", k%16, k), Payload: payload}
			}
			start := time.Now()
			msgs, err := st.store.ClaimBatch(ctx, params)
			claimed := time.Since(start)
			if err != nil {
				return nil, err
			}
			if len(msgs) != min(batchSize, st.res.Pending) {
				return nil, fmt.Errorf("claim returned %d messages at depth %d", len(msgs), st.res.Pending)
			}
			for _, m := range msgs {
				if m.OrderingKey != "" {
					return nil, fmt.Errorf("a claim took sequence %d of the stuck key", m.SequenceID)
				}
			}
			start = time.Now()
			if _, err := st.store.CompleteBatch(ctx, "scaling", dispatched(msgs)); err != nil {
				return nil, err
			}
			completed := time.Since(start)
			if _, err := outbox.EnqueueBatch(ctx, st.pool, refill[:len(msgs)]); err != nil {
				return nil, err
			}
			*st.next += len(msgs)
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

// EngineClaim is the claim the dispatch engine makes with its default
// configuration and the burn-down's route table: its ordered run, its
// memory budget per batch and the largest payload the route may send. A
// claim without them (MaxRun 1) is planned without the runs behind ordered
// heads, which is not the statement the engine runs.
func EngineClaim(batchSize int) (lease.ClaimParams, error) {
	routes, err := route.Parse([]byte(routesJSON), route.Options{})
	if err != nil {
		return lease.ClaimParams{}, err
	}
	return lease.ClaimParams{
		WorkerID: "scaling", BatchSize: batchSize, Lease: config.DefaultLease,
		MaxRun: config.DefaultOrderedRun, MaxBytes: config.DefaultBatchBytes, MaxPayloadBytes: routes.Routes[0].MaxPayloadBytes,
	}, nil
}

func dispatched(msgs []outboxtype.Message) []lease.Result {
	out := make([]lease.Result, len(msgs))
	for i, m := range msgs {
		out[i] = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeDispatched, Target: "routes[0]"}
	}
	return out
}
