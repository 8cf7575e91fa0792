package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Why a key is blocked, as BlockedKey.State says.
const (
	// BlockedRetrying: the head failed and waits for its next attempt.
	BlockedRetrying = "retrying"
	// BlockedLeaseExpired: the head's dispatcher held it past its lease
	// (it crashed or stalled); the reaper or the next claim requeues it.
	BlockedLeaseExpired = "lease_expired"
	// BlockedParked: the head died under on_dead = park; the key waits for
	// it to be replayed or discarded.
	BlockedParked = "parked"
	// BlockedUnsettled: the key has messages but no head: a dispatcher
	// could not settle its new head without waiting for a producer
	// committing to it, and no claim has since. The next claim does.
	BlockedUnsettled = "unsettled"
)

// BlockedKey is an ordering key whose messages cannot move, and why. A key
// is listed once, in the first state that holds it: parked, lease_expired,
// retrying, unsettled.
type BlockedKey struct {
	Namespace   string `json:"namespace"`
	OrderingKey string `json:"ordering_key"`
	// State is one of the Blocked* constants.
	State string `json:"state"`
	// Since is when the key became blocked: the head's first failure, its
	// lease expiry, its death, or when its settle was deferred.
	Since time.Time `json:"since"`
	// MessageID, SequenceID and Topic name the message the key waits on:
	// its head (the dead one when parked), or for an unsettled key the
	// message next in line.
	MessageID    uuid.UUID `json:"message_id"`
	SequenceID   int64     `json:"sequence_id,omitempty"`
	Topic        string    `json:"topic,omitempty"`
	AttemptCount int       `json:"attempt_count"`
	ErrorCode    string    `json:"error_code,omitempty"`
	Error        string    `json:"error,omitempty"`
	// Waiting counts the messages queued behind that message.
	Waiting int64 `json:"waiting"`
}

// BlockedKeys lists blocked ordering keys, longest blocked first, in one
// namespace or all (""), at most limit of them (0: 100).
func (s *Store) BlockedKeys(ctx context.Context, namespace string, limit int) ([]BlockedKey, error) {
	if limit < 0 {
		return nil, &Error{Op: "blocked keys", Kind: ErrInvalidArgument, Err: fmt.Errorf("limit must be positive, got %d", limit)}
	}
	if limit == 0 {
		limit = 100
	}
	rows, err := s.db.Query(ctx, `SELECT namespace, ordering_key, state, since, message_id, sequence_id, topic,
       attempt_count, error_code, error, waiting FROM outbox.blocked_keys($1, $2)`, nullable(namespace), limit)
	if err != nil {
		return nil, translate("blocked keys", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (BlockedKey, error) {
		var (
			b                  BlockedKey
			id                 *uuid.UUID
			seq                *int64
			attempts           *int
			topic, code, cause *string
		)
		err := row.Scan(&b.Namespace, &b.OrderingKey, &b.State, &b.Since, &id, &seq, &topic, &attempts, &code, &cause, &b.Waiting)
		if id != nil {
			b.MessageID = *id
		}
		if seq != nil {
			b.SequenceID = *seq
		}
		if attempts != nil {
			b.AttemptCount = *attempts
		}
		b.Topic, b.ErrorCode, b.Error = deref(topic), deref(code), deref(cause)
		return b, err
	})
	if err != nil {
		return nil, translate("blocked keys", err)
	}
	return out, nil
}

// DiscardRequest names messages to give up on for good.
type DiscardRequest struct {
	MessageIDs []uuid.UUID
	// Reason is required; it is kept in the attempts archive.
	Reason string
	// Operator names who discards (default: the database login, which is
	// recorded beside it in any case).
	Operator string
}

// Discarded is one message Discard removed, and where from.
type Discarded struct {
	ID uuid.UUID `json:"id"`
	// From is StatePending or StateDead.
	From string `json:"from"`
}

// Discard removes dead letters, and pending messages no dispatcher holds,
// for good, each with a DISCARDED attempt naming operator, login and
// reason. A parked key whose dead head is discarded goes on with its next
// message. A message leased right now is left alone and not returned.
func (s *Store) Discard(ctx context.Context, r DiscardRequest) ([]Discarded, error) {
	rows, err := s.db.Query(ctx, `SELECT message_id, discarded_from FROM outbox.discard($1, $2, $3)`,
		r.MessageIDs, r.Reason, nullable(r.Operator))
	if err != nil {
		return nil, translate("discard", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Discarded, error) {
		var d Discarded
		err := row.Scan(&d.ID, &d.From)
		return d, err
	})
	if err != nil {
		return nil, translate("discard", err)
	}
	return out, nil
}
