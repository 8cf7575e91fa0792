package outboxtype

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// Keys are what a message is found, routed, deduplicated and ordered by:
// fixed when it is enqueued, the same on every attempt and replay. Message,
// lease.DeadLetter and lease.StoredMessage embed them.
type Keys struct {
	ID          uuid.UUID `json:"id"`
	Namespace   string    `json:"namespace"`
	Topic       string    `json:"topic"`
	TenantID    string    `json:"tenant_id,omitempty"`
	DedupeKey   string    `json:"dedupe_key,omitempty"`
	OrderingKey string    `json:"ordering_key,omitempty"`
	// SequenceID orders the messages of one OrderingKey; 0 without one.
	SequenceID int64 `json:"sequence_id,omitempty"`
}

// StableKey is the key receivers deduplicate on: the dedupe key when the
// producer gave one, else the message id. It is the same on every attempt.
func (k *Keys) StableKey() string {
	if k.DedupeKey != "" {
		return k.DedupeKey
	}
	return k.ID.String()
}

// Message is a claimed message, leased to the claiming worker.
type Message struct {
	Keys
	// Payload is nil when the claim left it out (see PayloadOmitted).
	Payload json.RawMessage
	// PayloadBytes is the size of the payload's JSON as the producer sent it.
	PayloadBytes int
	Headers      map[string]string
	TraceHeader  string
	// Attempt is this claim's attempt number, from 1.
	Attempt        int
	LeaseToken     uuid.UUID
	LeaseExpiresAt time.Time
	CreatedAt      time.Time
	// DecodeError is set when the stored row cannot be turned into a
	// message (headers that are not a JSON object of strings, written
	// before the database refused them): the message can never be
	// delivered as it is, and only it fails, never the claim.
	DecodeError error
	// Offload is set when the payload was written to S3 (a route's claim-
	// check offload): Payload then holds the pointer the target receives.
	Offload *Offload
}

// Offload is where an offloaded payload lies.
type Offload struct {
	Bucket, Key string
	// Size is the payload's size in bytes, as written to the object.
	Size int
	// URL is a presigned GET URL of the object, valid until URLExpires;
	// set for the targets that receive the envelope (webhooks, Lambda).
	URL        string
	URLExpires time.Time
}

// PayloadOmitted reports whether the claim left the payload out because it
// is larger than the most any route may send (lease.ClaimParams'
// MaxPayloadBytes).
func (m *Message) PayloadOmitted() bool { return m.Payload == nil }
