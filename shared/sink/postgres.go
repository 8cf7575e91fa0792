package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresDeduper records handled webhook-ids in a PostgreSQL table, in the
// same transaction as the handler's own writes (see Tx): the receiver is
// then exactly once in effect for everything the handler writes there.
type PostgresDeduper struct {
	pool      *pgxpool.Pool
	insertSQL string
	purgeSQL  string
}

var _ Deduper = (*PostgresDeduper)(nil)

// NewPostgresDeduper returns a deduper on table ("name" or "schema.name"),
// creating it when missing:
//
//	webhook_id  text PRIMARY KEY
//	received_at timestamptz NOT NULL DEFAULT now()
//
// Receivers starting together serialize the creation on an advisory lock.
func NewPostgresDeduper(ctx context.Context, pool *pgxpool.Pool, table string) (*PostgresDeduper, error) {
	ident, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	name := ident.Sanitize()
	index := pgx.Identifier{ident[len(ident)-1] + "_received_at_idx"}.Sanitize()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// CREATE ... IF NOT EXISTS still races on the catalog when two
		// sessions run it at once; the lock makes them take turns.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "sink.dedupe:"+name); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+name+
			" (webhook_id text PRIMARY KEY, received_at timestamptz NOT NULL DEFAULT now())"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "CREATE INDEX IF NOT EXISTS "+index+" ON "+name+" (received_at)")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sink: create dedupe table %s: %w", name, err)
	}
	return &PostgresDeduper{
		pool:      pool,
		insertSQL: "INSERT INTO " + name + " (webhook_id) VALUES ($1) ON CONFLICT (webhook_id) DO NOTHING",
		purgeSQL:  "DELETE FROM " + name + " WHERE received_at < now() - make_interval(secs => $1)",
	}, nil
}

func parseTable(table string) (pgx.Identifier, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("sink: dedupe table %q: want name or schema.name", table)
	}
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("sink: dedupe table %q: empty name", table)
		}
	}
	return pgx.Identifier(parts), nil
}

// Begin implements Deduper: it opens a transaction and inserts webhookID.
// The insert waits while another transaction holds the same id, then
// inserts nothing (a duplicate) if that one committed.
func (d *PostgresDeduper) Begin(ctx context.Context, webhookID string) (context.Context, Delivery, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return ctx, nil, fmt.Errorf("sink: begin: %w", err)
	}
	tag, err := tx.Exec(ctx, d.insertSQL, webhookID)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return ctx, nil, fmt.Errorf("sink: record webhook-id: %w", err)
	}
	if tag.RowsAffected() == 0 {
		if err := tx.Rollback(ctx); err != nil {
			return ctx, nil, fmt.Errorf("sink: rollback a duplicate: %w", err)
		}
		return ctx, nil, ErrDuplicate
	}
	return context.WithValue(ctx, txKey{}, tx), postgresDelivery{tx}, nil
}

// Purge deletes the ids received more than olderThan ago and returns how
// many. Keep olderThan longer than the dispatcher can take to resend: its
// routes' retry span and the dead-letter replay window.
func (d *PostgresDeduper) Purge(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan <= 0 {
		return 0, errors.New("sink: purge: olderThan must be positive")
	}
	tag, err := d.pool.Exec(ctx, d.purgeSQL, olderThan.Seconds())
	if err != nil {
		return 0, fmt.Errorf("sink: purge: %w", err)
	}
	return tag.RowsAffected(), nil
}

type postgresDelivery struct{ tx pgx.Tx }

func (p postgresDelivery) Commit(ctx context.Context) error { return p.tx.Commit(ctx) }

func (p postgresDelivery) Rollback(ctx context.Context) error {
	err := p.tx.Rollback(ctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}

type txKey struct{}

// Tx returns the transaction of a delivery begun by a PostgresDeduper, for
// the handler to make its writes in: they commit with the webhook-id, or
// not at all. The receiver commits or rolls it back; the handler must not.
func Tx(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}
