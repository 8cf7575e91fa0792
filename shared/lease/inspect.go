package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// The read side for operators: what is dead, what a message looks like and
// everything that happened to it. These are plain reads of the outbox tables
// (outbox_operator and outbox_reader may SELECT them); they change nothing,
// so they need no function of their own.

// ErrMessageNotFound: no pending or dead message has the id (it was
// delivered and has left the queue, or never existed).
var ErrMessageNotFound = errors.New("lease: message not found")

// DeadFilter selects dead letters with the filters of outbox.replay_dead,
// combined with AND; zero fields do not filter. Letters come oldest failure
// first, as replay_dead takes them, so a listing shows exactly what a replay
// with the same filter and limit would move.
type DeadFilter struct {
	MessageIDs   []uuid.UUID
	Namespace    string
	Topic        string
	ErrorCode    string
	FailedAfter  time.Time // inclusive
	FailedBefore time.Time // exclusive
	// Limit caps the letters returned (0: 100).
	Limit int
}

// Filter is the request's selection, for listing what it matches.
func (r ReplayRequest) Filter() DeadFilter {
	return DeadFilter{
		MessageIDs: r.MessageIDs, Namespace: r.Namespace, Topic: r.Topic, ErrorCode: r.ErrorCode,
		FailedAfter: r.FailedAfter, FailedBefore: r.FailedBefore, Limit: r.Limit,
	}
}

// DeadLetter is one row of outbox.dead, without its payload.
type DeadLetter struct {
	outboxtype.Keys
	AttemptCount  int       `json:"attempt_count"`
	LastErrorCode string    `json:"last_error_code,omitempty"`
	LastError     string    `json:"last_error,omitempty"`
	FailedBy      string    `json:"failed_by,omitempty"`
	FailedAt      time.Time `json:"failed_at"`
	CreatedAt     time.Time `json:"created_at"`
	// HoldsKey: the message died as its key's head under on_dead = park,
	// and the key's later messages wait for it.
	HoldsKey bool `json:"holds_key,omitempty"`
}

// DeadLetters is one page of a listing.
type DeadLetters struct {
	Letters []DeadLetter `json:"dead_letters"`
	// Matched counts every letter the filter matches, beyond the limit too.
	Matched int `json:"matched"`
}

// The window count is computed before LIMIT applies, so one statement
// answers both "which" and "how many in all".
const listDeadSQL = `SELECT d.id, d.namespace, d.topic, d.tenant_id, d.dedupe_key, d.ordering_key, d.sequence_id,
       d.attempt_count, d.last_error_code, d.last_error, d.failed_by, d.failed_at, d.created_at, d.holds_key,
       count(*) OVER () AS matched
FROM outbox.dead d
WHERE ($1::uuid[] IS NULL OR d.id = ANY ($1))
  AND ($2::text IS NULL OR d.namespace = $2)
  AND ($3::text IS NULL OR d.topic = $3)
  AND ($4::text IS NULL OR d.last_error_code = $4)
  AND ($5::timestamptz IS NULL OR d.failed_at >= $5)
  AND ($6::timestamptz IS NULL OR d.failed_at < $6)
ORDER BY d.failed_at, d.id
LIMIT $7`

// ListDead lists the dead letters f matches, oldest failure first.
func (s *Store) ListDead(ctx context.Context, f DeadFilter) (DeadLetters, error) {
	limit := f.Limit
	if limit == 0 {
		limit = 100
	}
	if limit < 0 {
		return DeadLetters{}, &Error{Op: "list dead", Kind: ErrInvalidArgument, Err: fmt.Errorf("limit must be positive, got %d", limit)}
	}
	var ids []uuid.UUID
	if len(f.MessageIDs) > 0 {
		ids = f.MessageIDs
	}
	rows, err := s.db.Query(ctx, listDeadSQL, ids, nullable(f.Namespace), nullable(f.Topic), nullable(f.ErrorCode),
		nullableTime(f.FailedAfter), nullableTime(f.FailedBefore), limit)
	if err != nil {
		return DeadLetters{}, translate("list dead", err)
	}
	out := DeadLetters{Letters: []DeadLetter{}}
	for rows.Next() {
		var (
			d                                          DeadLetter
			tenant, dedupe, ordering, code, msg, owner *string
			sequence                                   *int64
		)
		if err := rows.Scan(&d.ID, &d.Namespace, &d.Topic, &tenant, &dedupe, &ordering, &sequence,
			&d.AttemptCount, &code, &msg, &owner, &d.FailedAt, &d.CreatedAt, &d.HoldsKey, &out.Matched); err != nil {
			rows.Close()
			return DeadLetters{}, translate("list dead", err)
		}
		d.TenantID, d.DedupeKey, d.OrderingKey = deref(tenant), deref(dedupe), deref(ordering)
		d.LastErrorCode, d.LastError, d.FailedBy = deref(code), deref(msg), deref(owner)
		if sequence != nil {
			d.SequenceID = *sequence
		}
		out.Letters = append(out.Letters, d)
	}
	if err := rows.Err(); err != nil {
		return DeadLetters{}, translate("list dead", err)
	}
	return out, nil
}

// Where a stored message is.
const (
	StatePending = "pending"
	StateDead    = "dead"
)

// StoredMessage is a message still in the outbox, pending or dead, with
// its payload.
type StoredMessage struct {
	outboxtype.Keys
	// State is StatePending or StateDead.
	State         string            `json:"state"`
	Payload       json.RawMessage   `json:"payload"`
	Headers       map[string]string `json:"headers"`
	TraceHeader   string            `json:"trace_header,omitempty"`
	AttemptCount  int               `json:"attempt_count"`
	CreatedAt     time.Time         `json:"created_at"`
	AvailableAt   time.Time         `json:"available_at"`
	LastErrorCode string            `json:"last_error_code,omitempty"`
	LastError     string            `json:"last_error,omitempty"`
	// NextAttemptAt, ClaimedBy and LeaseExpiresAt describe a pending message.
	NextAttemptAt  *time.Time `json:"next_attempt_at,omitempty"`
	ClaimedBy      string     `json:"claimed_by,omitempty"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	// FailedBy and FailedAt describe a dead letter.
	FailedBy string     `json:"failed_by,omitempty"`
	FailedAt *time.Time `json:"failed_at,omitempty"`
	// Behind: a pending ordered message waiting for an earlier one of its
	// key. HoldsKey: a dead message its key waits for (on_dead = park).
	Behind   bool `json:"behind,omitempty"`
	HoldsKey bool `json:"holds_key,omitempty"`
}

const lookupMessageSQL = `SELECT 'dead', d.id, d.namespace, d.topic, d.tenant_id, d.dedupe_key, d.ordering_key, d.sequence_id,
       d.payload, d.headers, d.trace_header, d.attempt_count, d.created_at, d.available_at,
       d.last_error_code, d.last_error, NULL::timestamptz, NULL::text, NULL::timestamptz, d.failed_by, d.failed_at,
       false, d.holds_key
FROM outbox.dead d WHERE d.id = $1
UNION ALL
SELECT 'pending', p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
       p.payload, p.headers, p.trace_header, p.attempt_count, p.created_at, p.available_at,
       p.last_error_code, p.last_error, p.next_attempt_at, p.claimed_by, p.lease_expires_at, NULL::text, NULL::timestamptz,
       p.behind, false
FROM outbox.pending p WHERE p.id = $1`

// LookupMessage reads a pending or dead message. It returns an error
// wrapping ErrMessageNotFound when the id is in neither.
func (s *Store) LookupMessage(ctx context.Context, id uuid.UUID) (StoredMessage, error) {
	rows, err := s.db.Query(ctx, lookupMessageSQL, id)
	if err != nil {
		return StoredMessage{}, translate("lookup", err)
	}
	msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StoredMessage, error) {
		var (
			m                                              StoredMessage
			tenant, dedupe, ordering, trace, code, lastErr *string
			claimedBy, failedBy                            *string
			sequence                                       *int64
			headers                                        []byte
		)
		err := row.Scan(&m.State, &m.ID, &m.Namespace, &m.Topic, &tenant, &dedupe, &ordering, &sequence,
			&m.Payload, &headers, &trace, &m.AttemptCount, &m.CreatedAt, &m.AvailableAt,
			&code, &lastErr, &m.NextAttemptAt, &claimedBy, &m.LeaseExpiresAt, &failedBy, &m.FailedAt,
			&m.Behind, &m.HoldsKey)
		m.Headers = readableHeaders(headers)
		m.TenantID, m.DedupeKey, m.OrderingKey, m.TraceHeader = deref(tenant), deref(dedupe), deref(ordering), deref(trace)
		m.LastErrorCode, m.LastError, m.ClaimedBy, m.FailedBy = deref(code), deref(lastErr), deref(claimedBy), deref(failedBy)
		if sequence != nil {
			m.SequenceID = *sequence
		}
		return m, err
	})
	if err != nil {
		return StoredMessage{}, translate("lookup", err)
	}
	if len(msgs) == 0 {
		return StoredMessage{}, &Error{Op: "lookup", Kind: ErrMessageNotFound, Err: fmt.Errorf("no pending or dead message has id %s", id)}
	}
	// A replay moves a row from dead to pending in one transaction, so the
	// id is in at most one of the two.
	return msgs[0], nil
}

// Attempt is one row of the append-only outbox.attempts archive: one
// outcome of one message.
type Attempt struct {
	ID        int64     `json:"id"`
	MessageID uuid.UUID `json:"message_id"`
	AttemptNo int       `json:"attempt_no"`
	// State is DISPATCHED, RETRYABLE, FAILED, ZOMBIE_REQUEUE, REPLAYED or
	// DISCARDED.
	State        string `json:"state"`
	WorkerID     string `json:"worker_id,omitempty"`
	Target       string `json:"target,omitempty"`
	TargetRef    string `json:"target_ref,omitempty"`
	ErrorCode    string `json:"error_code,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
	// LatencyMS is the publish call's duration (absent for outcomes with
	// no call, such as a replay).
	LatencyMS *int `json:"latency_ms,omitempty"`
	// Operator, DBUser (the database login) and Reason are recorded on
	// operator actions: REPLAYED and DISCARDED outcomes.
	Operator string `json:"operator,omitempty"`
	DBUser   string `json:"db_user,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Note explains an outcome further, e.g. a replay out of its key's
	// sequence.
	Note      string    `json:"note,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

const messageAttemptsSQL = `SELECT a.id, a.message_id, a.attempt_no, a.state, a.worker_id, a.target, a.target_ref,
       a.error_code, a.error_message, a.latency_ms, a.operator, a.db_user, a.reason, a.note, a.created_at
FROM outbox.attempts a
WHERE a.message_id = $1
ORDER BY a.id`

// MessageAttempts returns every recorded outcome of a message, oldest first
// (what retention has not purged). An unknown id has none.
func (s *Store) MessageAttempts(ctx context.Context, id uuid.UUID) ([]Attempt, error) {
	rows, err := s.db.Query(ctx, messageAttemptsSQL, id)
	if err != nil {
		return nil, translate("attempts", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attempt, error) {
		var (
			a                                                            Attempt
			worker, target, ref, code, msg, operator, user, reason, note *string
		)
		err := row.Scan(&a.ID, &a.MessageID, &a.AttemptNo, &a.State, &worker, &target, &ref,
			&code, &msg, &a.LatencyMS, &operator, &user, &reason, &note, &a.CreatedAt)
		a.WorkerID, a.Target, a.TargetRef = deref(worker), deref(target), deref(ref)
		a.ErrorCode, a.ErrorMessage, a.Operator, a.Reason = deref(code), deref(msg), deref(operator), deref(reason)
		a.DBUser, a.Note = deref(user), deref(note)
		return a, err
	})
	if err != nil {
		return nil, translate("attempts", err)
	}
	return out, nil
}

// readableHeaders decodes stored headers for an operator to read: a value
// that is not a string (written before the database refused them) shows as
// its JSON text rather than hiding the message.
func readableHeaders(raw []byte) map[string]string {
	if len(raw) == 0 {
		return nil
	}
	var strict map[string]string
	if json.Unmarshal(raw, &strict) == nil {
		return strict
	}
	var loose map[string]json.RawMessage
	if json.Unmarshal(raw, &loose) != nil {
		return map[string]string{"(unreadable headers)": string(raw)}
	}
	out := make(map[string]string, len(loose))
	for k, v := range loose {
		var str string
		if json.Unmarshal(v, &str) == nil {
			out[k] = str
		} else {
			out[k] = string(v)
		}
	}
	return out
}

// messageIDsBetweenSQL finds ids in the three places a message can be
// known by, each through its index on the id.
const messageIDsBetweenSQL = `SELECT id FROM (
    (SELECT id FROM outbox.pending WHERE id BETWEEN $1 AND $2 ORDER BY id LIMIT $3)
    UNION
    (SELECT id FROM outbox.dead WHERE id BETWEEN $1 AND $2 ORDER BY id LIMIT $3)
    UNION
    (SELECT message_id FROM outbox.attempts WHERE message_id BETWEEN $1 AND $2 ORDER BY message_id LIMIT $3)
) ids ORDER BY id LIMIT $3`

// MessageIDsBetween lists, in order, up to limit distinct ids from lo to
// hi (inclusive) of the messages pending, dead or with recorded attempts:
// how a prefix of an id is resolved, the ids sharing a prefix being a
// range.
func (s *Store) MessageIDsBetween(ctx context.Context, lo, hi uuid.UUID, limit int) ([]uuid.UUID, error) {
	rows, err := s.db.Query(ctx, messageIDsBetweenSQL, lo, hi, limit)
	if err != nil {
		return nil, translate("ids", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, translate("ids", err)
	}
	return ids, nil
}
