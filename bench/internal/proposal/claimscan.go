package proposal

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/lease"
)

// ScanRawStore is a dispatch.Store whose ClaimBatch is lease.Store's with
// two scan targets changed: the payload is scanned into a *[]byte (pgx then
// copies the bytes) rather than a *json.RawMessage (pgx then runs
// json.Unmarshal over every payload), and the headers are decoded only when
// they are not the empty object. CompleteBatch is lease.Store's.
type ScanRawStore struct {
	DB    lease.Querier
	Inner *lease.Store
}

var _ dispatch.Store = (*ScanRawStore)(nil)

// claimSQL is lease.claimSQL.
const claimSQL = `SELECT id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id, payload, headers,
       trace_header, attempt_count, lease_token, lease_expires_at, created_at
FROM outbox.claim_batch($1, $2, $3, $4)`

func (s *ScanRawStore) ClaimBatch(ctx context.Context, p lease.ClaimParams) ([]lease.Message, error) {
	leaseSeconds := int(math.Ceil(p.Lease.Seconds()))
	var namespaces []string
	if len(p.Namespaces) > 0 {
		namespaces = p.Namespaces
	}
	rows, err := s.DB.Query(ctx, claimSQL, p.BatchSize, p.WorkerID, leaseSeconds, namespaces)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]lease.Message, 0, max(p.BatchSize, 0))
	var headers []byte
	for rows.Next() {
		var (
			m                               lease.Message
			tenant, dedupe, ordering, trace *string
			sequence                        *int64
		)
		// The change: (*[]byte)(&m.Payload) and raw headers.
		if err := rows.Scan(&m.ID, &m.Namespace, &m.Topic, &tenant, &dedupe, &ordering, &sequence,
			(*[]byte)(&m.Payload), &headers, &trace, &m.Attempt, &m.LeaseToken, &m.LeaseExpiresAt, &m.CreatedAt); err != nil {
			return nil, err
		}
		if len(headers) > 2 {
			if err := json.Unmarshal(headers, &m.Headers); err != nil {
				return nil, fmt.Errorf("claim: headers of %s: %w", m.ID, err)
			}
		}
		m.TenantID, m.DedupeKey, m.OrderingKey, m.TraceHeader = deref(tenant), deref(dedupe), deref(ordering), deref(trace)
		if sequence != nil {
			m.SequenceID = *sequence
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

func (s *ScanRawStore) CompleteBatch(ctx context.Context, worker string, rs []lease.Result) ([]lease.Completion, error) {
	return s.Inner.CompleteBatch(ctx, worker, rs)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
