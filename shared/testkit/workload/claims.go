package workload

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnableFunctionStats makes the database count its PL/pgSQL functions'
// calls (track_functions = 'pl') for the sessions that connect from now
// on: set it before the dispatchers connect. It needs a superuser.
func EnableFunctionStats(ctx context.Context, admin *pgxpool.Pool, database string) error {
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s SET track_functions = 'pl'", pgx.Identifier{database}.Sanitize())); err != nil {
		return fmt.Errorf("workload: count function calls in %s: %w", database, err)
	}
	return nil
}

// ClaimCalls is the number of outbox.claim_batch calls the database has
// counted (pg_stat_user_functions). A session reports its counts when it
// goes idle, at most once a second, and when it ends: read it after the
// dispatchers' connections closed for an exact total.
func ClaimCalls(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_user_functions
		WHERE schemaname = 'outbox' AND funcname = 'claim_batch'`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("workload: count claim_batch calls: %w", err)
	}
	return n, nil
}
