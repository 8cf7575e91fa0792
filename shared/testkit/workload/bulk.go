package workload

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BulkChunk is the rows CommitBulkBacklog writes per statement.
const BulkChunk = 50_000

// bulkInsertSQL writes rows as outbox.enqueue_batch writes an unordered
// message without a dedupe key: a uuid v7 id in creation order, due now,
// the default workload's namespace, topic, tenants and payload — which
// also carries the message's own id, so that a target that receives the
// payload alone (EventBus) can tell the messages apart.
const bulkInsertSQL = `WITH rows AS (
    SELECT outbox.uuid_v7() AS id, g FROM generate_series($1::bigint, $2::bigint) g
), docs AS (
    SELECT id, g, jsonb_build_object('id', id, 'order', g, 'status', 'paid', 'amount_cents', 1000 + g % 9000,
        'currency', 'EUR', 'note', 'a payload of about two hundred bytes, as a small business event carries') AS payload
    FROM rows
)
INSERT INTO outbox.pending (id, namespace, topic, tenant_id, payload, payload_bytes)
SELECT id, 'bench', 'order_paid', 'tenant-' || (g % 16), payload, octet_length(payload::text) FROM docs ORDER BY g
RETURNING id`

// CommitBulkBacklog writes n messages straight into outbox.pending with
// INSERT ... SELECT, BulkChunk a statement, on one connection with
// synchronous_commit off, and notes each chunk's commit time in the
// ledger. It loads a backlog of a million in seconds where EnqueueBatch
// takes most of a minute: for measuring a drain, not the enqueue. It
// needs the rights to write the table (the schema owner or a superuser).
func CommitBulkBacklog(ctx context.Context, pool *pgxpool.Pool, ledger *Ledger, n int) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("workload: bulk backlog: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return fmt.Errorf("workload: bulk backlog: %w", err)
	}
	// The session setting must not outlive the load in the pool.
	defer conn.Exec(context.WithoutCancel(ctx), "RESET synchronous_commit")
	for first := 0; first < n; first += BulkChunk {
		last := min(n, first+BulkChunk) - 1
		rows, err := conn.Query(ctx, bulkInsertSQL, first, last)
		if err != nil {
			return fmt.Errorf("workload: bulk backlog: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return fmt.Errorf("workload: bulk backlog: %w", err)
		}
		ledger.Committed(time.Now(), ids...)
	}
	return nil
}
