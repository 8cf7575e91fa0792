package publish

import (
	"encoding/json"
	"fmt"
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
	Payload   json.RawMessage   `json:"payload"`
}

// NewEnvelope wraps a claimed message.
func NewEnvelope(m *outboxtype.Message) Envelope {
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

// PrepareEnvelope returns a Batcher's Prepare for the plugin publishers
// (webhook, lambdainvoke): a message's envelope, or its terminal refusal
// before any call when the payload or the envelope is over maxBytes. name
// prefixes the errors ("webhook: ...").
func PrepareEnvelope(name string, maxBytes int) func(*outboxtype.Message) ([]byte, int, *Result) {
	refuse := func(r Result) ([]byte, int, *Result) { return nil, 0, &r }
	tooLarge := func(size int, what string) Result {
		return Fail(outboxtype.CodePayloadTooLarge,
			fmt.Errorf("%s: the %s is %d bytes, over the target's cap of %d; not sent", name, what, size, maxBytes))
	}
	return func(m *outboxtype.Message) ([]byte, int, *Result) {
		if len(m.Payload) > maxBytes {
			return refuse(tooLarge(len(m.Payload), "payload"))
		}
		body, err := EncodeEnvelope(m)
		if err != nil {
			return refuse(Fail(outboxtype.CodeInvalidPayload, fmt.Errorf("%s: encode the envelope: %w", name, err)))
		}
		if len(body) > maxBytes {
			return refuse(tooLarge(len(body), "envelope"))
		}
		return body, len(body), nil
	}
}
