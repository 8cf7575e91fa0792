// Package floor drives the outbox state machine as bare SQL: the claim and
// completion statements that outbox.claim_batch and outbox.complete_batch
// run inside, sent straight over the wire protocol with no function, no
// JSON document and no decoding of the rows — a loop that only hands each
// claimed batch's ids and lease token back. Its rate is the floor the
// dispatch engine can approach; the gap is overhead the project owns.
package floor

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/dispatcher/bench/internal/latency"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
)

// ClaimSQL is what outbox.claim_batch (migrations/functions/claim_batch.sql)
// runs for unordered traffic, as one statement: the heads scan — unleased
// rows that are not queued behind an earlier message of their ordering key
// nor paused (`lease_token IS NULL AND NOT behind AND NOT paused`, the
// predicate of the partial index pending_claimable), due, in (next_attempt_at, id) order, locked with SKIP
// LOCKED — picks the ids, and the lease is written by primary key (= ANY of
// the picked ids), under one fresh lease token for the whole claim, with
// every column a dispatcher needs returned. What the function adds and this
// leaves out is its contract, not the state transition: the argument
// checks, the probes of outbox.unsettled_keys and outbox.paused, the runs behind ordered heads
// (none here: the workload is unordered, so the function's followers are
// empty), the sum of the claim's payload bytes (and, over its budget, the
// cut at the running sum), and the payload left out above the largest a
// route may send.
const ClaimSQL = `WITH heads AS (
    SELECT p.id
    FROM outbox.pending p
    WHERE p.lease_token IS NULL
      AND NOT p.behind
      AND NOT p.paused
      AND p.next_attempt_at <= now()
    ORDER BY p.next_attempt_at, p.id
    LIMIT $2
    FOR UPDATE OF p SKIP LOCKED
)
UPDATE outbox.pending p
SET claimed_by = $1, lease_token = (SELECT gen_random_uuid()),
    lease_expires_at = now() + interval '5 minutes', attempt_count = p.attempt_count + 1
WHERE p.id = ANY (ARRAY(SELECT h.id FROM heads h))
RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
          p.payload, p.headers, p.trace_header, p.attempt_count, p.lease_token,
          p.lease_expires_at, p.created_at, p.payload_bytes`

// CompleteSQL is complete_batch's DISPATCHED path: delete each row still
// leased to this worker under the claim's token and not expired, and append
// its attempt, as complete_batch's archive statement does: a plain INSERT,
// which attempts_one_dispatched_per_message refuses for a second DISPATCHED
// of one message (complete_batch then records the batch by its general
// statement, with ON CONFLICT; the floor's workload never has one). Ids come as one array, as the Go
// store sends complete_batch its results, matched with = ANY so that the
// primary key drives the delete: a join with unnest() of the array is
// planned from statistics gathered while nothing was leased (claimed_by all
// NULL) and loops over the whole batch for every row. A claim leases all
// its rows under one token, so the fence is one token, as complete_batch's
// per-result check is when every result carries its claim's token. What
// the function adds and this leaves out is its contract: a token, an
// outcome and the target's fields per result, the other outcomes (retries,
// dead letters, releases), the exceptions it reports, and the settling of
// ordering keys. Like complete_batch's statements it runs on a plan made
// once per session (see Run).
const CompleteSQL = `WITH removed AS (
    DELETE FROM outbox.pending p
    WHERE p.id = ANY ($2::uuid[]) AND p.lease_token = $3::uuid
      AND p.claimed_by = $1 AND p.lease_expires_at > now()
    RETURNING p.id, p.attempt_count, p.namespace, p.topic, p.tenant_id, p.dedupe_key,
              p.ordering_key, p.sequence_id
)
INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                             dedupe_key, ordering_key, sequence_id, target, latency_ms)
SELECT x.id, x.attempt_count, 'DISPATCHED', $1, x.namespace, x.topic, x.tenant_id,
       x.dedupe_key, x.ordering_key, x.sequence_id, 'floor', 0
FROM removed x`

// Settings are the session settings the floor's statements run under, as
// claim_batch's and complete_batch's run under their functions' SET
// clauses: each statement on a plan made once per session, generic, with
// sequential scans and sorts refused so that the plan is the walk of the
// index it must be whatever the statistics said when it was made (a
// generic plan cannot see the claim's LIMIT).
var Settings = map[string]string{"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off", "enable_sort": "off"}

// Prepare prepares the floor's two statements on c, as "floor_claim" and
// "floor_complete"; c must run under Settings.
func Prepare(ctx context.Context, c *pgconn.PgConn) error {
	for _, s := range []struct{ name, sql string }{{"floor_claim", ClaimSQL}, {"floor_complete", CompleteSQL}} {
		if _, err := c.Prepare(ctx, s.name, s.sql, nil); err != nil {
			return fmt.Errorf("prepare %s: %w", s.name, err)
		}
	}
	return nil
}

// Connect opens a connection to url under Settings, with the floor's two
// statements prepared on it.
func Connect(ctx context.Context, url string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	maps.Copy(cfg.RuntimeParams, Settings)
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := Prepare(ctx, c); err != nil {
		c.Close(context.Background())
		return nil, err
	}
	return c, nil
}

// Claim runs the floor's claim of up to limit rows for worker on c
// (prepared by Prepare) and decodes nothing: it writes the claimed ids to
// ids as an array literal and the claim's token to token, and returns how
// many rows it claimed.
func Claim(ctx context.Context, c *pgconn.PgConn, worker, limit []byte, ids *bytes.Buffer, token *[]byte) (int, error) {
	return ClaimWith(ctx, c, "floor_claim", [][]byte{worker, limit}, ids, token)
}

// ClaimWith is Claim through another prepared statement of the claim's
// shape (the same columns returned), with its own arguments: a variant of
// the floor's claim measured against it.
func ClaimWith(ctx context.Context, c *pgconn.PgConn, stmt string, args [][]byte, ids *bytes.Buffer, token *[]byte) (int, error) {
	ids.Reset()
	ids.WriteByte('{')
	n := 0
	rr := c.ExecPrepared(ctx, stmt, args, nil, nil)
	for rr.NextRow() {
		v := rr.Values()
		if n > 0 {
			ids.WriteByte(',')
		} else {
			*token = append((*token)[:0], v[11]...)
		}
		ids.Write(v[0])
		n++
	}
	ids.WriteByte('}')
	if _, err := rr.Close(); err != nil {
		return 0, fmt.Errorf("claim: %w", err)
	}
	return n, nil
}

// Complete runs the floor's completion of the n claimed ids under token
// on c, and fails unless it recorded all n.
func Complete(ctx context.Context, c *pgconn.PgConn, worker, ids, token []byte, n int) error {
	tag, err := c.ExecPrepared(ctx, "floor_complete", [][]byte{worker, ids, token}, nil, nil).Close()
	if err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	if int(tag.RowsAffected()) != n {
		return fmt.Errorf("complete recorded %d of %d messages", tag.RowsAffected(), n)
	}
	return nil
}

// Result is one floor run.
type Result struct {
	Clients         int
	BatchSize       int
	Messages        int
	Elapsed         time.Duration
	Claim, Complete time.Duration
	// ClaimLatency and CompleteLatency summarise the calls of full
	// batches; IntervalLatency the time between the ends of two successive
	// full-batch completions on one connection, as the engine's is measured.
	ClaimLatency, CompleteLatency, IntervalLatency latency.Summary
	Batches                                        int
}

// Rate is messages per second.
func (r Result) Rate() float64 { return float64(r.Messages) / r.Elapsed.Seconds() }

// IntervalRate is the rate at the p50 batch interval (see
// outboxrun.BurnDownResult.IntervalRate).
func (r Result) IntervalRate() float64 {
	if r.IntervalLatency.P50 == 0 {
		return 0
	}
	return float64(r.Clients*r.BatchSize) / r.IntervalLatency.P50.Seconds()
}

// Run drains db's pending queue with clients connections, each looping
// claim → complete until a claim comes back empty.
func Run(ctx context.Context, db *scratch.DB, clients, batchSize int) (Result, error) {
	if err := db.Exec(ctx, "VACUUM ANALYZE outbox.pending"); err != nil {
		return Result{}, err
	}
	conns := make([]*pgconn.PgConn, clients)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}()
	for i := range conns {
		c, err := Connect(ctx, db.URL)
		if err != nil {
			return Result{}, err
		}
		conns[i] = c
	}
	type tally struct {
		messages, batches int
		claim, complete   time.Duration
		claims, completes []time.Duration
		intervals         []time.Duration
		err               error
	}
	tallies := make([]tally, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range conns {
		wg.Go(func() {
			t := &tallies[i]
			worker := []byte(fmt.Sprintf("floor-%d", i))
			limit := []byte(fmt.Sprint(batchSize))
			var ids bytes.Buffer
			var token []byte
			var lastEnd time.Time
			for {
				began := time.Now()
				n, err := Claim(ctx, c, worker, limit, &ids, &token)
				if err != nil {
					t.err = err
					return
				}
				took := time.Since(began)
				t.claim += took
				if n == batchSize {
					t.claims = append(t.claims, took)
				}
				if n == 0 {
					return
				}
				began = time.Now()
				err = Complete(ctx, c, worker, ids.Bytes(), token, n)
				end := time.Now()
				took = end.Sub(began)
				t.complete += took
				if n == batchSize {
					t.completes = append(t.completes, took)
					if !lastEnd.IsZero() {
						t.intervals = append(t.intervals, end.Sub(lastEnd))
					}
					lastEnd = end
				} else {
					lastEnd = time.Time{}
				}
				if err != nil {
					t.err = err
					return
				}
				t.messages += n
				t.batches++
			}
		})
	}
	wg.Wait()
	res := Result{Clients: clients, BatchSize: batchSize, Elapsed: time.Since(start)}
	var claims, completes, intervals []time.Duration
	for _, t := range tallies {
		intervals = append(intervals, t.intervals...)
		claims = append(claims, t.claims...)
		completes = append(completes, t.completes...)
		if t.err != nil {
			return Result{}, t.err
		}
		res.Messages += t.messages
		res.Batches += t.batches
		res.Claim += t.claim
		res.Complete += t.complete
	}
	res.ClaimLatency, res.CompleteLatency = latency.Summarise(claims), latency.Summarise(completes)
	res.IntervalLatency = latency.Summarise(intervals)
	return res, nil
}
