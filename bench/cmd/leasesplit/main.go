// Command leasesplit measures a schema the queue does not use, to answer
// whether it should: the lease state (attempts, due time, lease, flags) in
// a narrow table of its own beside an immutable table of the messages,
// against today's one row per message. A claim rewrites the row it leases,
// and PostgreSQL writes a new version of the whole row, payload and all; a
// narrow state row would make that write small. The cost moves to the
// claim's join of the leased state rows with their messages (the claim
// returns the payload) and to the completion's second delete.
//
// Both shapes run the bare-SQL floor's two statements (bench/internal/floor)
// on tables modelled on outbox.pending: the same columns and the indexes
// those statements touch, 512-byte payloads, batches of 1000. Each round
// drains a fresh database of both, the two shapes taking turns batch by
// batch on one connection whose backend's CPU is read from /proc, as
// callcost does; the server's WAL is read around each call.
//
//	go run ./cmd/leasesplit                 # from bench/: 5 rounds of 50,000 messages, a throwaway cluster
//	go run ./cmd/leasesplit -cluster host   # the server at -database-url
//
// It prints figures, and fails only when a round does not drain.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/bench/internal/callcost"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
)

// schema is both shapes: w_pending (one row per message, as
// outbox.pending) and n_msg with n_state (the messages, and their lease
// state), and one archive.
const schema = `
CREATE TABLE w_pending (
  id uuid PRIMARY KEY, namespace text NOT NULL, topic text NOT NULL, tenant_id text, dedupe_key text,
  ordering_key text, sequence_id bigint, payload jsonb NOT NULL, payload_bytes int NOT NULL, headers jsonb NOT NULL DEFAULT '{}',
  trace_header text, attempt_count int NOT NULL DEFAULT 0, available_at timestamptz NOT NULL DEFAULT now(),
  next_attempt_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now(),
  last_error_code text, last_error text, failing_since timestamptz, claimed_by text, lease_token uuid,
  lease_expires_at timestamptz, run_through bigint, behind bool NOT NULL DEFAULT false,
  park_on_dead bool NOT NULL DEFAULT false, paused bool NOT NULL DEFAULT false);
CREATE INDEX w_claimable ON w_pending (next_attempt_at, id) WHERE lease_token IS NULL AND NOT behind AND NOT paused;
CREATE INDEX w_lease ON w_pending (lease_expires_at) WHERE lease_token IS NOT NULL AND attempt_count >= 0;
CREATE UNIQUE INDEX w_key_seq ON w_pending (namespace, ordering_key, sequence_id) WHERE ordering_key IS NOT NULL;
CREATE TABLE n_msg (
  id uuid PRIMARY KEY, namespace text NOT NULL, topic text NOT NULL, tenant_id text, dedupe_key text,
  ordering_key text, sequence_id bigint, payload jsonb NOT NULL, payload_bytes int NOT NULL, headers jsonb NOT NULL DEFAULT '{}',
  trace_header text, available_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now());
CREATE UNIQUE INDEX n_key_seq ON n_msg (namespace, ordering_key, sequence_id) WHERE ordering_key IS NOT NULL;
CREATE TABLE n_state (
  id uuid PRIMARY KEY, attempt_count int NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(),
  claimed_by text, lease_token uuid, lease_expires_at timestamptz, run_through bigint,
  behind bool NOT NULL DEFAULT false, paused bool NOT NULL DEFAULT false,
  last_error_code text, last_error text, failing_since timestamptz, park_on_dead bool NOT NULL DEFAULT false);
CREATE INDEX n_claimable ON n_state (next_attempt_at, id) WHERE lease_token IS NULL AND NOT behind AND NOT paused;
CREATE INDEX n_lease ON n_state (lease_expires_at) WHERE lease_token IS NOT NULL AND attempt_count >= 0;
CREATE TABLE w_attempts (id bigserial, message_id uuid, attempt_no int, state text, worker_id text, namespace text, topic text,
  tenant_id text, dedupe_key text, ordering_key text, sequence_id bigint, target text, latency_ms int);
CREATE UNIQUE INDEX w_att_one ON w_attempts (message_id) WHERE state = 'DISPATCHED';
CREATE INDEX w_att_msg ON w_attempts (message_id);
`

// fill enqueues $1 messages into each shape, with ids in enqueue order as
// the queue's time-ordered ids are (and distinct between the shapes, which
// share the archive).
const fill = `
INSERT INTO w_pending (id, namespace, topic, payload, payload_bytes)
SELECT (lpad(to_hex(g), 8, '0') || '-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
       'ns', 'topic', jsonb_build_object('data', repeat('x', 490)), 512
FROM generate_series(1, $1) g;
INSERT INTO n_msg (id, namespace, topic, payload, payload_bytes)
SELECT (lpad(to_hex(g), 8, '0') || '-0001-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
       'ns', 'topic', jsonb_build_object('data', repeat('x', 490)), 512
FROM generate_series(1, $1) g;
INSERT INTO n_state (id) SELECT id FROM n_msg;
VACUUM ANALYZE w_pending;
VACUUM ANALYZE n_msg;
VACUUM ANALYZE n_state;
CHECKPOINT;
`

const claimWide = `WITH heads AS (
  SELECT p.id FROM w_pending p WHERE p.lease_token IS NULL AND NOT p.behind AND NOT p.paused AND p.next_attempt_at <= now()
  ORDER BY p.next_attempt_at, p.id LIMIT 1000 FOR UPDATE OF p SKIP LOCKED)
UPDATE w_pending p SET claimed_by = 'w', lease_token = $1, lease_expires_at = now() + interval '5 minutes', attempt_count = p.attempt_count + 1
WHERE p.id = ANY (ARRAY(SELECT h.id FROM heads h))
RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id, p.payload, p.headers, p.trace_header, p.attempt_count, p.lease_token, p.lease_expires_at, p.created_at, p.payload_bytes`

const claimNarrow = `WITH heads AS (
  SELECT s.id FROM n_state s WHERE s.lease_token IS NULL AND NOT s.behind AND NOT s.paused AND s.next_attempt_at <= now()
  ORDER BY s.next_attempt_at, s.id LIMIT 1000 FOR UPDATE OF s SKIP LOCKED),
leased AS (
UPDATE n_state s SET claimed_by = 'w', lease_token = $1, lease_expires_at = now() + interval '5 minutes', attempt_count = s.attempt_count + 1
WHERE s.id = ANY (ARRAY(SELECT h.id FROM heads h))
RETURNING s.id, s.attempt_count, s.lease_token, s.lease_expires_at)
SELECT m.id, m.namespace, m.topic, m.tenant_id, m.dedupe_key, m.ordering_key, m.sequence_id, m.payload, m.headers, m.trace_header, l.attempt_count, l.lease_token, l.lease_expires_at, m.created_at, m.payload_bytes
FROM n_msg m JOIN leased l ON l.id = m.id
WHERE m.id = ANY (ARRAY(SELECT l.id FROM leased l))`

const completeWide = `WITH removed AS (
  DELETE FROM w_pending p WHERE p.id = ANY ($1::uuid[]) AND p.lease_token = $2 AND p.claimed_by = 'w' AND p.lease_expires_at > now()
  RETURNING p.id, p.attempt_count, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id)
INSERT INTO w_attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id, target, latency_ms)
SELECT x.id, x.attempt_count, 'DISPATCHED', 'w', x.namespace, x.topic, x.tenant_id, x.dedupe_key, x.ordering_key, x.sequence_id, 'floor', 0 FROM removed x
ON CONFLICT (message_id) WHERE state = 'DISPATCHED' DO NOTHING`

const completeNarrow = `WITH removed AS (
  DELETE FROM n_state s WHERE s.id = ANY ($1::uuid[]) AND s.lease_token = $2 AND s.claimed_by = 'w' AND s.lease_expires_at > now()
  RETURNING s.id, s.attempt_count),
gone AS (DELETE FROM n_msg m USING removed r WHERE m.id = r.id
  RETURNING m.id, r.attempt_count, m.namespace, m.topic, m.tenant_id, m.dedupe_key, m.ordering_key, m.sequence_id)
INSERT INTO w_attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id, target, latency_ms)
SELECT x.id, x.attempt_count, 'DISPATCHED', 'w', x.namespace, x.topic, x.tenant_id, x.dedupe_key, x.ordering_key, x.sequence_id, 'floor', 0 FROM gone x
ON CONFLICT (message_id) WHERE state = 'DISPATCHED' DO NOTHING`

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "leasesplit:", err)
		os.Exit(1)
	}
}

// shape is one schema's claim and completion.
type shape struct{ name, claim, complete string }

// cost is what a shape's drain cost the backend, per message.
type cost struct {
	claim, complete   float64 // µs of CPU
	claimWAL, doneWAL int64   // bytes of WAL
}

func (c cost) both() float64 { return c.claim + c.complete }

func run() error {
	var (
		target   = scratch.TargetFlags()
		messages = flag.Int("messages", 50000, "messages each shape drains a round")
		rounds   = flag.Int("rounds", 5, "rounds, each on a fresh database")
	)
	flag.Parse()
	ctx := context.Background()
	srv, stopCluster, err := target.Open(ctx)
	if err != nil {
		return err
	}
	defer stopCluster()
	fmt.Println(target.Describe())
	wide := shape{"one row", claimWide, completeWide}
	split := shape{"split", claimNarrow, completeNarrow}
	var ratios []float64
	fmt.Printf("%d messages of 512 bytes, batch 1000; PostgreSQL's CPU (µs) and WAL (bytes) per message\n", *messages)
	fmt.Printf("%-5s %-8s %9s %9s %10s %9s %9s\n", "round", "shape", "claim µs", "claim WAL", "complete µs", "compl WAL", "both µs")
	for round := range *rounds {
		order := []shape{wide, split} // which goes first in each turn
		if round%2 == 1 {
			order = []shape{split, wide}
		}
		costs := map[string]cost{}
		db, err := srv.Create(ctx, "leasesplit")
		if err != nil {
			return err
		}
		err = func() error {
			defer db.Drop()
			c, err := pgx.Connect(ctx, db.URL)
			if err != nil {
				return err
			}
			defer c.Close(context.Background())
			if _, err := c.Exec(ctx, schema); err != nil {
				return err
			}
			for _, s := range strings.Split(fill, ";\n") {
				if s = strings.TrimSpace(s); s == "" {
					continue
				}
				var args []any
				if strings.Contains(s, "$1") {
					args = append(args, *messages)
				}
				if _, err := c.Exec(ctx, s, args...); err != nil {
					return err
				}
			}
			// The floor's session: plans made once, walks of the indexes.
			for _, s := range []string{"SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off", "SET enable_sort = off", "SET jit = off"} {
				if _, err := c.Exec(ctx, s); err != nil {
					return err
				}
			}
			// The shapes take turns batch by batch, so that whatever the
			// server does meanwhile (checkpoints, autovacuum) falls on both.
			m := meter{c: c, pid: c.PgConn().PID()}
			t := make([]totals, len(order))
			for !t[0].drained || !t[1].drained {
				for i, sh := range order {
					if t[i].drained {
						continue
					}
					if err := batch(ctx, m, sh, round, &t[i]); err != nil {
						return fmt.Errorf("%s: %w", sh.name, err)
					}
				}
			}
			for i, sh := range order {
				if t[i].messages != *messages {
					return fmt.Errorf("%s: drained %d of %d messages", sh.name, t[i].messages, *messages)
				}
				costs[sh.name] = t[i].cost()
			}
			return nil
		}()
		if err != nil {
			return err
		}
		for _, sh := range []shape{wide, split} {
			k := costs[sh.name]
			fmt.Printf("%-5d %-8s %9.2f %9d %10.2f %9d %9.2f\n", round+1, sh.name, k.claim, k.claimWAL, k.complete, k.doneWAL, k.both())
		}
		ratios = append(ratios, costs[split.name].both()/costs[wide.name].both())
	}
	slices.Sort(ratios)
	fmt.Printf("split ÷ one row, claim and completion: median %.3f (%.3f–%.3f over %d rounds)\n",
		ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1], len(ratios))
	return nil
}

// meter reads what the backend serving c has spent: its CPU time, from
// /proc, and the WAL the server has written.
type meter struct {
	c   *pgx.Conn
	pid uint32
}

func (m meter) read(ctx context.Context) (time.Duration, int64, error) {
	cpu, err := callcost.BackendCPU(m.pid)
	if err != nil {
		return 0, 0, err
	}
	var wal int64
	err = m.c.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() - '0/0'").Scan(&wal)
	return cpu, wal, err
}

// totals is one shape's drain so far.
type totals struct {
	claimCPU, doneCPU time.Duration
	claimWAL, doneWAL int64
	messages, batches int
	drained           bool
}

func (t totals) cost() cost {
	n := float64(max(t.messages, 1))
	return cost{
		claim: float64(t.claimCPU.Nanoseconds()) / 1e3 / n, complete: float64(t.doneCPU.Nanoseconds()) / 1e3 / n,
		claimWAL: t.claimWAL / int64(max(t.messages, 1)), doneWAL: t.doneWAL / int64(max(t.messages, 1)),
	}
}

// batch claims one batch of sh's messages on c and completes it, adding
// what each call cost to t; a claim that finds nothing marks t drained.
func batch(ctx context.Context, m meter, sh shape, round int, t *totals) error {
	// measured runs call and adds its CPU and WAL to *cpu and *wal (the
	// WAL read's own statement writes none).
	measured := func(cpu *time.Duration, wal *int64, call func() error) error {
		t0, w0, err := m.read(ctx)
		if err != nil {
			return err
		}
		if err := call(); err != nil {
			return err
		}
		t1, w1, err := m.read(ctx)
		*cpu += t1 - t0
		*wal += w1 - w0
		return err
	}
	token := fmt.Sprintf("%08x-0000-4000-8000-%012x", round, t.batches)
	t.batches++
	var ids []string
	err := measured(&t.claimCPU, &t.claimWAL, func() error {
		rows, err := m.c.Query(ctx, sh.claim, token)
		if err != nil {
			return err
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return err
			}
			ids = append(ids, fmt.Sprintf("%x", vals[0]))
		}
		return rows.Err()
	})
	if err != nil || len(ids) == 0 {
		t.drained = err == nil
		return err
	}
	err = measured(&t.doneCPU, &t.doneWAL, func() error {
		tag, err := m.c.Exec(ctx, sh.complete, "{"+strings.Join(ids, ",")+"}", token)
		if err == nil && int(tag.RowsAffected()) != len(ids) {
			err = fmt.Errorf("completed %d of %d", tag.RowsAffected(), len(ids))
		}
		return err
	})
	t.messages += len(ids)
	return err
}
