package publish

import (
	"encoding/json"
	"time"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// Envelope is what plugin endpoints (HTTP webhooks and Lambda functions)
// receive: the message's payload with every key a receiver needs to be
// idempotent and to keep order.
type Envelope struct {
	// ID is the message id, stable across attempts and replays.
	ID string `json:"id"`
	// Key is the stable key receivers deduplicate on: the dedupe key, or
	// the id when the producer gave none. It is also the webhook-id.
	Key         string `json:"key"`
	Namespace   string `json:"namespace"`
	Topic       string `json:"topic"`
	TenantID    string `json:"tenant_id,omitempty"`
	DedupeKey   string `json:"dedupe_key,omitempty"`
	OrderingKey string `json:"ordering_key,omitempty"`
	// SequenceID orders messages of one ordering key (absent without one).
	SequenceID int64 `json:"sequence_id,omitempty"`
	// Attempt is the delivery attempt, from 1.
	Attempt   int               `json:"attempt"`
	CreatedAt time.Time         `json:"created_at"`
	Headers   map[string]string `json:"headers,omitempty"`
	// Payload is null when the payload was offloaded to S3: Offload says
	// where it is.
	Payload json.RawMessage  `json:"payload"`
	Offload *EnvelopeOffload `json:"offload,omitempty"`
}

// EnvelopeOffload points at a payload written to S3 (claim-check offload):
// the receiver GETs URL before it expires, or reads the object with its own
// credentials.
type EnvelopeOffload struct {
	S3Bucket     string    `json:"s3_bucket"`
	S3Key        string    `json:"s3_key"`
	Size         int       `json:"size"`
	URL          string    `json:"url,omitempty"`
	URLExpiresAt time.Time `json:"url_expires_at,omitzero"`
}

// NewEnvelope wraps a claimed message.
func NewEnvelope(m *outboxtype.Message) Envelope {
	if o := m.Offload; o != nil {
		e := newEnvelope(m)
		e.Payload = nil
		e.Offload = &EnvelopeOffload{S3Bucket: o.Bucket, S3Key: o.Key, Size: o.Size, URL: o.URL, URLExpiresAt: o.URLExpires.UTC()}
		return e
	}
	return newEnvelope(m)
}

func newEnvelope(m *outboxtype.Message) Envelope {
	return Envelope{
		ID: m.ID.String(), Key: m.StableKey(), Namespace: m.Namespace, Topic: m.Topic,
		TenantID: m.TenantID, DedupeKey: m.DedupeKey, OrderingKey: m.OrderingKey,
		SequenceID: m.SequenceID, Attempt: m.Attempt, CreatedAt: m.CreatedAt.UTC(),
		Headers: m.Headers, Payload: m.Payload,
	}
}

// EncodeEnvelope is the JSON body a plugin endpoint receives for m.
func EncodeEnvelope(m *outboxtype.Message) ([]byte, error) {
	return json.Marshal(NewEnvelope(m))
}
