package pgtest

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// QueryCounter is a pgx tracer that counts the queries a pool runs.
type QueryCounter struct {
	mu      sync.Mutex
	queries []string
}

var _ pgx.QueryTracer = (*QueryCounter)(nil)

// TraceQueryStart records the query.
func (c *QueryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	c.queries = append(c.queries, data.SQL)
	c.mu.Unlock()
	return ctx
}

// TraceQueryEnd does nothing.
func (c *QueryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Reset forgets the queries seen so far.
func (c *QueryCounter) Reset() {
	c.mu.Lock()
	c.queries = nil
	c.mu.Unlock()
}

// Queries returns the queries seen since the last Reset.
func (c *QueryCounter) Queries() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.queries...)
}

// RoundTrips counts network round trips on a pool's connections: a round
// trip starts whenever the client writes after having read (or for the first
// time). It measures what the tracer cannot: statements that pgx sends in
// more than one exchange, such as a prepare before the first execution.
type RoundTrips struct {
	n atomic.Int64
}

// Install wraps the pool's dialer so that its connections are counted.
func (r *RoundTrips) Install(cfg *pgxpool.Config) {
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: conn, trips: &r.n, readSinceWrite: true}, nil
	}
}

// Reset sets the count to zero.
func (r *RoundTrips) Reset() { r.n.Store(0) }

// Count is the round trips since the last Reset.
func (r *RoundTrips) Count() int64 { return r.n.Load() }

type countingConn struct {
	net.Conn
	trips          *atomic.Int64
	mu             sync.Mutex
	readSinceWrite bool
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if c.readSinceWrite {
		c.trips.Add(1)
		c.readSinceWrite = false
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.mu.Lock()
		c.readSinceWrite = true
		c.mu.Unlock()
	}
	return n, err
}
