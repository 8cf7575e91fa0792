// Package gate is the database side of the per-target circuit breakers and
// rate limits (the routes' "circuit_breaker" and "rate_limit"): their state
// lives in outbox.breakers and outbox.rate_limits, shared by every
// concurrent dispatcher, and each method here is one call to one outbox
// function, so one round trip.
package gate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// RouteOptions are a route's "circuit_breaker" and "rate_limit" as
// written; the type lives in outboxtype so that package route, which every
// publisher links, does not link pgx through this package.
type RouteOptions = outboxtype.GateOptions

// Querier runs queries: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Store calls the gate functions.
type Store struct{ db Querier }

// NewStore returns a store on db.
func NewStore(db Querier) *Store { return &Store{db: db} }

// States of a breaker as the gate answers them.
const (
	Closed = "closed"
	Open   = "open"
	Probe  = "probe"
)

// Ask is what a batch would send one target.
type Ask struct {
	Target string
	Wanted int
	// CoolDown is the breaker's (0: the target has none); PerSecond the
	// rate limit's (0: none).
	CoolDown  time.Duration
	PerSecond int
}

// Grant is how many of them may go now.
type Grant struct {
	Granted int
	// State is Closed, Open or Probe (this caller won the probe: Granted
	// is at most 1).
	State string
	// RetryAt is when to offer the rest again (zero when all were
	// granted).
	RetryAt   time.Time
	LastError string
	// Failures is the closed breaker's count of consecutive failures.
	Failures int
}

// Gate asks outbox.gate_targets for the batch's targets, in one round trip.
func (s *Store) Gate(ctx context.Context, workerID string, asks []Ask) (map[string]Grant, error) {
	targets := make([]string, len(asks))
	wanted := make([]int32, len(asks))
	coolDown := make([]pgtype.Int4, len(asks))
	rate := make([]pgtype.Int4, len(asks))
	for i, a := range asks {
		targets[i], wanted[i] = a.Target, int32(a.Wanted)
		if a.CoolDown > 0 {
			coolDown[i] = pgtype.Int4{Int32: int32(a.CoolDown.Milliseconds()), Valid: true}
		}
		if a.PerSecond > 0 {
			rate[i] = pgtype.Int4{Int32: int32(a.PerSecond), Valid: true}
		}
	}
	rows, err := s.db.Query(ctx, `SELECT target, granted, state, retry_at, last_error, failures
		FROM outbox.gate_targets($1, $2, $3, $4, $5)`, workerID, targets, wanted, coolDown, rate)
	if err != nil {
		return nil, fmt.Errorf("gate: gate_targets: %w", err)
	}
	out := make(map[string]Grant, len(asks))
	for rows.Next() {
		var (
			t        string
			g        Grant
			retryAt  pgtype.Timestamptz
			lastErr  pgtype.Text
			granted  int32
			failures int32
		)
		if err := rows.Scan(&t, &granted, &g.State, &retryAt, &lastErr, &failures); err != nil {
			rows.Close()
			return nil, fmt.Errorf("gate: gate_targets: %w", err)
		}
		g.Granted, g.RetryAt, g.LastError, g.Failures = int(granted), retryAt.Time, lastErr.String, int(failures)
		out[t] = g
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("gate: gate_targets: %w", err)
	}
	return out, nil
}

// Outcome is what one batch's calls to a target with a breaker did.
type Outcome struct {
	Target    string
	Succeeded bool // any call delivered
	// Failures are the retryable failures after the last success (all of
	// them when none succeeded).
	Failures  int
	Threshold int
	CoolDown  time.Duration
	LastError string
}

// State is a breaker's state after an Outcome was recorded.
type State struct {
	Open    bool
	ProbeAt time.Time
}

// Record records the outcomes with outbox.record_target_outcomes, in one
// round trip.
func (s *Store) Record(ctx context.Context, workerID string, outs []Outcome) (map[string]State, error) {
	n := len(outs)
	targets, succeeded, failures := make([]string, n), make([]bool, n), make([]int32, n)
	threshold, coolDown, lastErr := make([]int32, n), make([]int32, n), make([]string, n)
	for i, o := range outs {
		targets[i], succeeded[i], failures[i] = o.Target, o.Succeeded, int32(o.Failures)
		threshold[i], coolDown[i], lastErr[i] = int32(o.Threshold), int32(o.CoolDown.Milliseconds()), o.LastError
	}
	rows, err := s.db.Query(ctx, `SELECT target, state, probe_at
		FROM outbox.record_target_outcomes($1, $2, $3, $4, $5, $6, $7)`,
		workerID, targets, succeeded, failures, threshold, coolDown, lastErr)
	if err != nil {
		return nil, fmt.Errorf("gate: record_target_outcomes: %w", err)
	}
	out := make(map[string]State, n)
	for rows.Next() {
		var (
			t, state string
			probeAt  pgtype.Timestamptz
		)
		if err := rows.Scan(&t, &state, &probeAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("gate: record_target_outcomes: %w", err)
		}
		out[t] = State{Open: state == Open, ProbeAt: probeAt.Time}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("gate: record_target_outcomes: %w", err)
	}
	return out, nil
}

// OpenBreaker is a breaker that is open now.
type OpenBreaker struct {
	Target    string    `json:"target"`
	Since     time.Time `json:"since"`
	NextProbe time.Time `json:"next_probe"`
	Failures  int       `json:"failures"`
	// LastError is why: the last failure recorded.
	LastError string `json:"last_error"`
}

// OpenBreakers lists the open breakers (outbox.open_breakers).
func OpenBreakers(ctx context.Context, db Querier) ([]OpenBreaker, error) {
	rows, err := db.Query(ctx, `SELECT target, opened_at, probe_at, failures, coalesce(last_error, '') FROM outbox.open_breakers()`)
	if err != nil {
		return nil, fmt.Errorf("gate: open_breakers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OpenBreaker, error) {
		var b OpenBreaker
		var failures int32
		err := r.Scan(&b.Target, &b.Since, &b.NextProbe, &failures, &b.LastError)
		b.Failures = int(failures)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("gate: open_breakers: %w", err)
	}
	return out, nil
}
