package dbpool

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool is the connection pool Open builds: a *pgxpool.Pool whose Query,
// QueryRow, Exec, SendBatch, Begin and BeginTx run every transaction under
// the configured timeouts.
//
// Without a transaction pooler these are the pgx pool's own: the timeouts
// are startup parameters, the sessions' defaults. Behind one
// (PoolerTransaction), a session may be served by another server connection
// at each transaction, and PgBouncer refuses those startup parameters; so
// each call carries SET LOCAL in the round trip of its statement. A
// statement alone goes as the simple-protocol query "SET LOCAL
// statement_timeout = …; <statement>", which PostgreSQL runs as one
// implicit transaction; a transaction begins with "BEGIN; SET LOCAL
// statement_timeout = …; SET LOCAL idle_in_transaction_session_timeout =
// …". Nothing outlives the transaction, so no server connection carries a
// setting from one client to the next.
//
// Acquire, AcquireFunc and CopyFrom are the pgx pool's own: behind a
// transaction pooler, what runs on the connections they hand out gets no
// timeouts.
type Pool struct {
	*pgxpool.Pool
	// setStatementTimeout sets the statement timeout of one transaction,
	// setTimeouts both timeouts; both are "" when the timeouts are startup
	// parameters.
	setStatementTimeout string
	setTimeouts         string
}

// newPool wraps pool, setting the timeouts per transaction when cfg's
// pooler cannot carry them as startup parameters.
func newPool(pool *pgxpool.Pool, cfg Config) *Pool {
	p := &Pool{Pool: pool}
	if cfg.Pooler == PoolerTransaction {
		p.setStatementTimeout = "SET LOCAL statement_timeout = " + milliseconds(cfg.StatementTimeout)
		p.setTimeouts = p.setStatementTimeout +
			"; SET LOCAL idle_in_transaction_session_timeout = " + milliseconds(cfg.IdleInTransactionTimeout)
	}
	return p
}

// scoped is sql preceded by the statement timeout, in one batch: with the
// simple protocol, one query string and so one implicit transaction.
func (p *Pool) scoped(sql string, args []any) *pgx.Batch {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
	b.Queue(p.setStatementTimeout)
	b.Queue(sql, args...)
	return b
}

// Query runs sql and returns its rows; the connection goes back to the pool
// when they are closed, as with pgxpool.
func (p *Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if p.setStatementTimeout == "" {
		return p.Pool.Query(ctx, sql, args...)
	}
	br := p.Pool.SendBatch(ctx, p.scoped(sql, args))
	if _, err := br.Exec(); err != nil {
		br.Close()
		return errRows{err}, err
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return errRows{err}, err
	}
	return &batchRows{Rows: rows, batch: br}, nil
}

// QueryRow runs sql for at most one row; as with pgxpool, the connection
// goes back to the pool when Scan is called.
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if p.setStatementTimeout == "" {
		return p.Pool.QueryRow(ctx, sql, args...)
	}
	rows, err := p.Query(ctx, sql, args...)
	return &batchRow{rows: rows, err: err}
}

// Exec runs sql and returns its command tag.
func (p *Pool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if p.setStatementTimeout == "" {
		return p.Pool.Exec(ctx, sql, args...)
	}
	br := p.Pool.SendBatch(ctx, p.scoped(sql, args))
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	return tag, err
}

// SendBatch sends b in one round trip. Behind a transaction pooler the
// statement timeout goes first, unseen by the caller: b's results are read
// as usual.
func (p *Pool) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if p.setStatementTimeout == "" {
		return p.Pool.SendBatch(ctx, b)
	}
	scoped := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(b.QueuedQueries)+1)}
	scoped.Queue(p.setStatementTimeout)
	scoped.QueuedQueries = append(scoped.QueuedQueries, b.QueuedQueries...)
	br := p.Pool.SendBatch(ctx, scoped)
	// A failure here is the batch's: pgx answers every later read with it.
	_, _ = br.Exec()
	return br
}

// Begin starts a transaction; see BeginTx.
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx starts a transaction with opts. Behind a transaction pooler the
// BEGIN carries the timeouts in its round trip (a begin query with no
// arguments goes with the simple protocol, so it may hold three
// statements).
func (p *Pool) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	if p.setTimeouts != "" {
		opts.BeginQuery = beginQuery(opts) + "; " + p.setTimeouts
	}
	return p.Pool.BeginTx(ctx, opts)
}

// beginQuery is the statement pgx would begin a transaction of opts with,
// which pgx does not export.
func beginQuery(opts pgx.TxOptions) string {
	if opts.BeginQuery != "" {
		return opts.BeginQuery
	}
	var b strings.Builder
	b.WriteString("BEGIN")
	if opts.IsoLevel != "" {
		b.WriteString(" ISOLATION LEVEL " + string(opts.IsoLevel))
	}
	if opts.AccessMode != "" {
		b.WriteString(" " + string(opts.AccessMode))
	}
	if opts.DeferrableMode != "" {
		b.WriteString(" " + string(opts.DeferrableMode))
	}
	return b.String()
}

// batchRows are the rows of a statement sent in a batch: closing them
// closes the batch, which gives the connection back to the pool.
type batchRows struct {
	pgx.Rows
	batch  pgx.BatchResults
	closed bool
	err    error // the batch's closing error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.batch.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// batchRow is QueryRow's row, with pgx's semantics: no row is
// pgx.ErrNoRows, and the rows are closed by Scan.
type batchRow struct {
	rows pgx.Rows
	err  error
}

func (r *batchRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// errRows are the rows of a query that failed before it had any.
type errRows struct{ err error }

func (errRows) Close()                                       {}
func (r errRows) Err() error                                 { return r.err }
func (errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                          { return r.err }
func (r errRows) Values() ([]any, error)                     { return nil, r.err }
func (errRows) RawValues() [][]byte                          { return nil }
func (errRows) Conn() *pgx.Conn                              { return nil }
func (errRows) TypeMap() *pgtype.Map                         { return nil }
