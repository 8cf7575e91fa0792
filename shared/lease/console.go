package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// The operator console's store side: what is pending and why, retrying
// messages now, purging old dead letters, pausing namespaces and topics.
// Each is one call of a database function (migrations/functions/), which
// refuses what it must whoever calls it; the actions are audited there.

// Where a pending message stands, as PendingMessage.State says.
const (
	PendingLeased       = "leased"        // a dispatcher holds it now
	PendingLeaseExpired = "lease_expired" // its dispatcher held it past the lease
	PendingPaused       = "paused"        // its namespace or topic is paused
	PendingBehind       = "behind"        // an earlier message of its key goes first
	PendingRetrying     = "retrying"      // it failed and waits for its next attempt
	PendingScheduled    = "scheduled"     // its producer made it available later
	PendingDue          = "due"           // waiting for a claim now
	// HeadParked and HeadUnsettled describe only the head a message waits
	// behind: a parked dead letter, or no head yet.
	HeadParked    = "parked"
	HeadUnsettled = "unsettled"
)

// PendingFilter selects pending messages; zero fields do not filter, and
// the rest combine with AND.
type PendingFilter struct {
	MessageIDs  []uuid.UUID
	Namespace   string
	Topic       string
	OrderingKey string
	// Retrying: only messages that failed at least once.
	Retrying bool
	// Blocked: only messages of ordering keys that cannot move (see
	// BlockedKeys).
	Blocked bool
	// OlderThan: only messages available longer ago than this.
	OlderThan time.Duration
	// Limit caps the messages returned (0: 100; at most 10000).
	Limit int
}

// PendingMessage is one message of outbox.pending as an operator reads it,
// without its payload.
type PendingMessage struct {
	outboxtype.Keys
	// State is one of the Pending* constants.
	State         string     `json:"state"`
	AttemptCount  int        `json:"attempt_count"`
	LastErrorCode string     `json:"last_error_code,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	AvailableAt   time.Time  `json:"available_at"`
	NextAttemptAt time.Time  `json:"next_attempt_at"`
	ClaimedBy     string     `json:"claimed_by,omitempty"`
	LeaseExpires  *time.Time `json:"lease_expires_at,omitempty"`
	// WaitsBehind is, for a message behind an earlier one of its key, what
	// the key waits on.
	WaitsBehind *KeyHead `json:"waits_behind,omitempty"`
}

// KeyHead is the message an ordering key waits on.
type KeyHead struct {
	// ID and SequenceID are absent when the key has no head yet
	// (State HeadUnsettled).
	ID         *uuid.UUID `json:"id,omitempty"`
	SequenceID int64      `json:"sequence_id,omitempty"`
	// State is a Pending* state of the head, or HeadParked (a dead letter
	// the key waits for), or HeadUnsettled.
	State     string `json:"state"`
	ErrorCode string `json:"error_code,omitempty"`
}

// PendingMessages is one page of a listing.
type PendingMessages struct {
	Messages []PendingMessage `json:"messages"`
	// Matched counts every message the filter matches, beyond the limit.
	Matched int64 `json:"matched"`
}

// ListPending lists the pending messages f matches, longest available
// first, through outbox.pending_messages.
func (s *Store) ListPending(ctx context.Context, f PendingFilter) (PendingMessages, error) {
	limit := f.Limit
	if limit == 0 {
		limit = 100
	}
	if limit < 0 || f.OlderThan < 0 {
		return PendingMessages{}, &Error{Op: "list pending", Kind: ErrInvalidArgument,
			Err: fmt.Errorf("limit and age must not be negative, got %d and %s", limit, f.OlderThan)}
	}
	var ids []uuid.UUID
	if len(f.MessageIDs) > 0 {
		ids = f.MessageIDs
	}
	rows, err := s.db.Query(ctx, `SELECT id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id, state,
       attempt_count, last_error_code, last_error, created_at, available_at, next_attempt_at, claimed_by, lease_expires_at,
       head_id, head_sequence_id, head_state, head_error_code, matched
FROM outbox.pending_messages($1, $2, $3, $4, $5, $6, $7, $8)`,
		nullable(f.Namespace), nullable(f.Topic), nullable(f.OrderingKey), f.Retrying, f.Blocked,
		nullableInterval(f.OlderThan), limit, ids)
	if err != nil {
		return PendingMessages{}, translate("list pending", err)
	}
	out := PendingMessages{Messages: []PendingMessage{}}
	for rows.Next() {
		var (
			m                                                  PendingMessage
			tenant, dedupe, ordering, code, msg, owner, hState *string
			hCode                                              *string
			sequence, hSequence                                *int64
			hID                                                *uuid.UUID
		)
		if err := rows.Scan(&m.ID, &m.Namespace, &m.Topic, &tenant, &dedupe, &ordering, &sequence, &m.State,
			&m.AttemptCount, &code, &msg, &m.CreatedAt, &m.AvailableAt, &m.NextAttemptAt, &owner, &m.LeaseExpires,
			&hID, &hSequence, &hState, &hCode, &out.Matched); err != nil {
			rows.Close()
			return PendingMessages{}, translate("list pending", err)
		}
		m.TenantID, m.DedupeKey, m.OrderingKey = deref(tenant), deref(dedupe), deref(ordering)
		m.LastErrorCode, m.LastError, m.ClaimedBy = deref(code), deref(msg), deref(owner)
		if sequence != nil {
			m.SequenceID = *sequence
		}
		if hState != nil {
			m.WaitsBehind = &KeyHead{ID: hID, State: *hState, ErrorCode: deref(hCode)}
			if hSequence != nil {
				m.WaitsBehind.SequenceID = *hSequence
			}
		}
		out.Messages = append(out.Messages, m)
	}
	if err := rows.Err(); err != nil {
		return PendingMessages{}, translate("list pending", err)
	}
	return out, nil
}

// RetryRequest names retrying messages whose next attempt should be now.
type RetryRequest struct {
	MessageIDs []uuid.UUID
	// Reason is required; it is kept in the attempts archive.
	Reason string
	// Operator names who acts (default: the database login, which is
	// recorded beside it in any case).
	Operator string
}

// Rescheduled is a message RetryNow moved, and when its next attempt was
// due before.
type Rescheduled struct {
	ID                uuid.UUID `json:"id"`
	PreviousAttemptAt time.Time `json:"previous_attempt_at"`
}

// RetryNow moves the next attempt of retrying messages (pending, unleased,
// failed at least once) to now, keeping their attempt counts, each with a
// RESCHEDULED attempt naming operator, login and reason. All or nothing:
// a message leased, dead, delivered or never failed refuses the whole call
// with an error wrapping ErrRefused that names each.
func (s *Store) RetryNow(ctx context.Context, r RetryRequest) ([]Rescheduled, error) {
	rows, err := s.db.Query(ctx, `SELECT message_id, previous_attempt_at FROM outbox.retry_now($1, $2, $3)`,
		r.MessageIDs, r.Reason, nullable(r.Operator))
	if err != nil {
		return nil, translate("retry now", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Rescheduled, error) {
		var m Rescheduled
		err := row.Scan(&m.ID, &m.PreviousAttemptAt)
		return m, err
	})
	if err != nil {
		return nil, translate("retry now", err)
	}
	return out, nil
}

// PurgeDeadRequest selects the dead letters to give up on for good.
type PurgeDeadRequest struct {
	// OlderThan: letters that failed longer ago than this (at least 24h).
	OlderThan time.Duration
	// Namespace and Topic narrow the purge ("" for all).
	Namespace, Topic string
	// MaxRows bounds one call (1-10000), oldest first.
	MaxRows int
	// Reason is required; Operator as for RetryRequest.
	Reason, Operator string
}

// PurgedDead says what a purge did.
type PurgedDead struct {
	Purged int64 `json:"purged"`
	// Remaining counts the letters still older than the window: beyond
	// MaxRows, or held by a replay or discard at that moment.
	Remaining int64 `json:"remaining"`
}

// PurgeDead discards the dead letters older than a window, each with a
// DISCARDED attempt (operator, login, reason, a note that it was purged),
// and records the purge in outbox.operator_log.
func (s *Store) PurgeDead(ctx context.Context, r PurgeDeadRequest) (PurgedDead, error) {
	var out PurgedDead
	err := s.db.QueryRow(ctx, `SELECT purged, remaining FROM outbox.purge_dead($1, $2, $3, $4, $5, $6)`,
		r.OlderThan, r.MaxRows, nullable(r.Operator), r.Reason, nullable(r.Namespace), nullable(r.Topic)).
		Scan(&out.Purged, &out.Remaining)
	if err != nil {
		return PurgedDead{}, translate("purge dead", err)
	}
	return out, nil
}

// AllTopics as a pause's topic pauses the whole namespace.
const AllTopics = "*"

// PauseRequest names a namespace, or one topic of it, to pause or resume.
type PauseRequest struct {
	Namespace string
	// Topic is one topic, or "" (or AllTopics) for the whole namespace.
	Topic string
	// Reason is required; Operator as for RetryRequest.
	Reason, Operator string
}

// Pause pauses a namespace or topic: claims skip its messages until
// Resume. It returns how many pending messages it paused. Pausing what is
// already paused is refused (ErrRefused), naming who paused it and why.
func (s *Store) Pause(ctx context.Context, r PauseRequest) (int64, error) {
	var n int64
	if err := s.db.QueryRow(ctx, `SELECT outbox.pause($1, $2, $3, $4)`,
		r.Namespace, nullable(r.Topic), nullable(r.Operator), r.Reason).Scan(&n); err != nil {
		return 0, translate("pause", err)
	}
	return n, nil
}

// Resume ends a pause Pause made (the same namespace and topic) and
// returns how many pending messages are claimable again. Resuming what is
// not paused is refused (ErrRefused).
func (s *Store) Resume(ctx context.Context, r PauseRequest) (int64, error) {
	var n int64
	if err := s.db.QueryRow(ctx, `SELECT outbox.resume($1, $2, $3, $4)`,
		r.Namespace, nullable(r.Topic), nullable(r.Operator), r.Reason).Scan(&n); err != nil {
		return 0, translate("resume", err)
	}
	return n, nil
}

// Pause is one pause in force.
type Pause struct {
	Namespace string `json:"namespace"`
	// Topic is a topic, or AllTopics for the whole namespace.
	Topic string `json:"topic"`
	// PausedBy is the operator name given (empty if none); DBUser is the
	// login that paused it.
	PausedBy string    `json:"paused_by,omitempty"`
	DBUser   string    `json:"db_user"`
	Reason   string    `json:"reason"`
	PausedAt time.Time `json:"paused_at"`
	// Messages counts the pending messages the pause holds.
	Messages int64 `json:"messages"`
}

// Pauses lists the pauses in force, oldest first.
func (s *Store) Pauses(ctx context.Context) ([]Pause, error) {
	rows, err := s.db.Query(ctx, `SELECT namespace, topic, paused_by, db_user, reason, paused_at, messages FROM outbox.pauses()`)
	if err != nil {
		return nil, translate("pauses", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Pause, error) {
		var (
			p  Pause
			by *string
		)
		err := row.Scan(&p.Namespace, &p.Topic, &by, &p.DBUser, &p.Reason, &p.PausedAt, &p.Messages)
		p.PausedBy = deref(by)
		return p, err
	})
	if err != nil {
		return nil, translate("pauses", err)
	}
	return out, nil
}
