// Package callcost measures what PostgreSQL spends on each call of a
// batch: the engine's claim and completion (outbox.claim_batch and
// outbox.complete_batch, through lease.Store as the engine calls them) and
// the bare-SQL floor's two statements (package floor), as the CPU time of
// the one backend serving the connection (/proc/<pid>/schedstat, in
// nanoseconds), not as wall-clock time.
//
// The floor goals compare throughput, and on a shared two-core machine the
// same run moves by ±30% within a minute: wall-clock comparisons of the two
// paths overlap from run to run. Here the two paths take turns, batch by
// batch, on one connection to one copy of the queue, so whatever the
// machine does moves both alike, and the ratios of their server CPU per
// message hold still from round to round. At one connection the backend is
// what limits both paths' rate, so the ratio bounds the engine's share of
// the floor's.
package callcost

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/bench/internal/floor"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// Cost is the server CPU one path spent on its claims and completions in a
// round, and the messages they moved.
type Cost struct {
	Claim, Complete time.Duration
	Messages        int
}

// PerMessage is d in microseconds per message of the path.
func (c Cost) PerMessage(d time.Duration) float64 {
	return float64(d.Nanoseconds()) / 1e3 / float64(max(c.Messages, 1))
}

// Round is one drained copy: what each path cost.
type Round struct{ Engine, Floor Cost }

// ClaimRatio, CompleteRatio and Ratio are the engine's server CPU per
// message over the floor's: for the claims, the completions, both.
func (r Round) ClaimRatio() float64 {
	return r.Engine.PerMessage(r.Engine.Claim) / r.Floor.PerMessage(r.Floor.Claim)
}
func (r Round) CompleteRatio() float64 {
	return r.Engine.PerMessage(r.Engine.Complete) / r.Floor.PerMessage(r.Floor.Complete)
}
func (r Round) Ratio() float64 {
	return r.Engine.PerMessage(r.Engine.Claim+r.Engine.Complete) / r.Floor.PerMessage(r.Floor.Claim+r.Floor.Complete)
}

// Spread is the median, least and greatest of one figure over rounds.
type Spread struct{ Median, Min, Max float64 }

// Summarise is f's Spread over rounds.
func Summarise(rounds []Round, f func(Round) float64) Spread {
	if len(rounds) == 0 {
		return Spread{}
	}
	v := make([]float64, len(rounds))
	for i, r := range rounds {
		v[i] = f(r)
	}
	slices.Sort(v)
	return Spread{Median: v[len(v)/2], Min: v[0], Max: v[len(v)-1]}
}

// Run measures rounds fresh copies of template (a migrated database with
// its queue enqueued), the floor going first in every other round. variant,
// when not empty, is SQL run in each copy first (a CREATE OR REPLACE of
// outbox.complete_batch, say, to measure a change to it).
func Run(ctx context.Context, srv *scratch.Server, template string, batch, rounds int, variant string) ([]Round, error) {
	var out []Round
	for round := range rounds {
		engine, bare, err := measure(ctx, srv, template, batch, variant, round%2 == 1)
		if err != nil {
			return nil, err
		}
		out = append(out, Round{Engine: engine, Floor: bare})
	}
	return out, nil
}

// measure drains a fresh copy of the template on one connection, the
// engine's calls and the floor's taking turns batch by batch (the floor
// first when floorFirst), and returns what each path cost the backend.
func measure(ctx context.Context, srv *scratch.Server, template string, batch int, variant string, floorFirst bool) (engine, bare Cost, err error) {
	db, err := srv.CreateFrom(ctx, "callcost", template)
	if err != nil {
		return Cost{}, Cost{}, err
	}
	defer db.Drop()
	if variant != "" {
		if err := db.Exec(ctx, variant); err != nil {
			return Cost{}, Cost{}, fmt.Errorf("the variant's SQL: %w", err)
		}
	}
	if err := db.Exec(ctx, "VACUUM ANALYZE outbox.pending"); err != nil {
		return Cost{}, Cost{}, err
	}
	// The floor's statements need its session settings; the functions set
	// their own, so the engine's calls are the same under them.
	pool, err := db.Pool(ctx, 1, func(cfg *pgxpool.Config) { maps.Copy(cfg.ConnConfig.RuntimeParams, floor.Settings) })
	if err != nil {
		return Cost{}, Cost{}, err
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return Cost{}, Cost{}, err
	}
	defer conn.Release()
	pg := conn.Conn().PgConn()
	if err := floor.Prepare(ctx, pg); err != nil {
		return Cost{}, Cost{}, err
	}
	backend := pg.PID()
	// timed adds the backend's CPU over call to *into.
	timed := func(into *time.Duration, call func() error) error {
		before, err := BackendCPU(backend)
		if err != nil {
			return err
		}
		if err := call(); err != nil {
			return err
		}
		after, err := BackendCPU(backend)
		*into += after - before
		return err
	}

	store := lease.NewStore(conn)
	worker, limit := []byte("floor"), []byte(strconv.Itoa(batch))
	var ids bytes.Buffer
	var token []byte
	results := make([]lease.Result, 0, batch)
	// What the dispatch engine asks for with its defaults, behind the
	// burn-down's catch-all EventBridge route (256 KiB payloads at most).
	engineClaim := lease.ClaimParams{WorkerID: "engine", BatchSize: batch, Lease: 5 * time.Minute,
		MaxRun: config.DefaultOrderedRun, MaxBytes: config.DefaultBatchBytes, MaxPayloadBytes: 256 << 10}
	for turn := 0; ; turn++ {
		if (turn%2 == 0) == floorFirst {
			n := 0
			if err := timed(&bare.Claim, func() (err error) {
				n, err = floor.Claim(ctx, pg, worker, limit, &ids, &token)
				return err
			}); err != nil {
				return Cost{}, Cost{}, err
			}
			if n == 0 {
				break
			}
			if err := timed(&bare.Complete, func() error { return floor.Complete(ctx, pg, worker, ids.Bytes(), token, n) }); err != nil {
				return Cost{}, Cost{}, err
			}
			bare.Messages += n
			continue
		}
		var msgs []outboxtype.Message
		if err := timed(&engine.Claim, func() (err error) {
			msgs, err = store.ClaimBatch(ctx, engineClaim)
			return err
		}); err != nil {
			return Cost{}, Cost{}, err
		}
		if len(msgs) == 0 {
			break
		}
		// What the engine records for a message its no-op route delivered.
		results = results[:0]
		for i := range msgs {
			results = append(results, lease.Result{ID: msgs[i].ID, LeaseToken: msgs[i].LeaseToken,
				Outcome: outboxtype.OutcomeDispatched, Target: "all"})
		}
		var completions []lease.Completion
		if err := timed(&engine.Complete, func() (err error) {
			completions, err = store.CompleteBatch(ctx, "engine", results)
			return err
		}); err != nil {
			return Cost{}, Cost{}, err
		}
		for _, c := range completions {
			if c.Status != outboxtype.StatusOK {
				return Cost{}, Cost{}, fmt.Errorf("complete_batch answered %s for message %s", c.Status, c.ID)
			}
		}
		engine.Messages += len(msgs)
	}
	var left int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox.pending").Scan(&left); err != nil {
		return Cost{}, Cost{}, err
	}
	if left != 0 {
		return Cost{}, Cost{}, fmt.Errorf("%d messages left pending", left)
	}
	return engine, bare, nil
}

// BackendCPU is the CPU time the PostgreSQL backend of process id pid has
// spent so far, from /proc/<pid>/schedstat: PostgreSQL must run on this
// machine.
func BackendCPU(pid uint32) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, fmt.Errorf("PostgreSQL must run on this machine: %w", err)
	}
	ns, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
	return time.Duration(ns), err
}
