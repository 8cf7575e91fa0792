package dbpool

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The SQLSTATEs of a server that is no longer the one to write to.
const (
	sqlstateReadOnly          = "25006" // read_only_sql_transaction
	sqlstateAdminShutdown     = "57P01" // admin_shutdown, also pg_terminate_backend
	sqlstateCrashShutdown     = "57P02" // crash_shutdown
	sqlstateCannotConnectNow  = "57P03" // cannot_connect_now: starting up, or a standby
	sqlstateConnectionClassID = "08"    // connection_exception and its subclasses
)

// IsFailover reports whether err is one of the ways a failover reaches a
// client: the server went read-only under the connection (SQLSTATE 25006:
// a demoted primary, or a name that still resolves to one), it is shutting
// down, crashed or is not accepting connections yet (57P01, which
// pg_terminate_backend sends too, 57P02, 57P03), or the connection failed
// (class 08). Whichever it is, the pool's other connections lead to the
// same place.
func IsFailover(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case sqlstateReadOnly, sqlstateAdminShutdown, sqlstateCrashShutdown, sqlstateCannotConnectNow:
		return true
	}
	return strings.HasPrefix(pgErr.Code, sqlstateConnectionClassID)
}

// failoverObserver is a pgx tracer that drops the pool's connections when a
// statement fails in a way that says they lead to the wrong server, or
// nowhere: IsFailover, or its connection closed under it (a reset, a
// server that stopped answering). The pool then opens new connections as
// they are needed, each resolving the host again, so that the next
// invocation — or the next attempt of this one — reaches the new primary.
// Without it, a warm function would keep its connections to a demoted
// server and fail every invocation with 25006 until they aged out.
//
// A tracer sees every statement's outcome on every path (Query, Exec,
// batches, transactions), which no pool hook does.
type failoverObserver struct {
	pool   atomic.Pointer[pgxpool.Pool]
	logger *slog.Logger
	// last is the last error acted on: a batch reports a statement's
	// error once for the statement and again as the batch's.
	last atomic.Pointer[error]
}

var (
	_ pgx.QueryTracer = (*failoverObserver)(nil)
	_ pgx.BatchTracer = (*failoverObserver)(nil)
)

func (o *failoverObserver) observe(conn *pgx.Conn, err error) {
	if err == nil {
		return
	}
	closed := conn != nil && conn.IsClosed()
	if !closed && !IsFailover(err) {
		return
	}
	pool := o.pool.Load()
	if pool == nil {
		return
	}
	if last := o.last.Swap(&err); last != nil && errors.Is(err, *last) {
		return
	}
	pool.Reset()
	attrs := []any{"error", err.Error(), "connection_closed", closed}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		attrs = append(attrs, "sqlstate", pgErr.Code)
	}
	o.logger.Warn("the database connection failed or the server is no longer writable (a failover?): "+
		"every pooled connection is dropped, and the next ones connect anew", attrs...)
}

// TraceQueryStart does nothing.
func (o *failoverObserver) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd observes a statement's outcome.
func (o *failoverObserver) TraceQueryEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	o.observe(conn, data.Err)
}

// TraceBatchStart does nothing.
func (o *failoverObserver) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery observes the outcome of a statement of a batch.
func (o *failoverObserver) TraceBatchQuery(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	o.observe(conn, data.Err)
}

// TraceBatchEnd observes a batch's outcome.
func (o *failoverObserver) TraceBatchEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	o.observe(conn, data.Err)
}
