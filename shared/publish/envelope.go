package publish

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
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
	if b, ok := appendEnvelope(make([]byte, 0, 320+len(m.Payload)), m); ok {
		return b, nil
	}
	return json.Marshal(NewEnvelope(m))
}

// appendEnvelope writes the bytes json.Marshal writes for m's envelope,
// without reflection, for the messages that need no escaping: every string
// plain ASCII, a payload without what encoding/json escapes in a
// RawMessage, a creation time with an RFC 3339 form, no offload pointer.
// Anything else is left to json.Marshal (ok false). Reflection was 8-9% of
// a dispatch bootstrap's CPU per webhook message under Lambda's share; the
// fuzz test holds the two encodings byte for byte equal.
func appendEnvelope(b []byte, m *outboxtype.Message) (_ []byte, ok bool) {
	key := m.StableKey()
	created := m.CreatedAt.UTC()
	if year := created.Year(); year < 0 || year > 9999 || len(m.Payload) == 0 || m.Offload != nil ||
		!plain(key) || !plain(m.Namespace) || !plain(m.Topic) || !plain(m.TenantID) ||
		!plain(m.DedupeKey) || !plain(m.OrderingKey) || needsEscape(m.Payload) {
		return nil, false
	}
	for name, value := range m.Headers {
		if !plain(name) || !plain(value) {
			return nil, false
		}
	}
	b = append(b, `{"id":"`...)
	b = append(b, m.ID.String()...)
	b = appendField(b, `","key":"`, key)
	b = appendField(b, `","namespace":"`, m.Namespace)
	b = appendField(b, `","topic":"`, m.Topic)
	b = append(b, '"')
	if m.TenantID != "" {
		b = appendField(b, `,"tenant_id":"`, m.TenantID)
		b = append(b, '"')
	}
	if m.DedupeKey != "" {
		b = appendField(b, `,"dedupe_key":"`, m.DedupeKey)
		b = append(b, '"')
	}
	if m.OrderingKey != "" {
		b = appendField(b, `,"ordering_key":"`, m.OrderingKey)
		b = append(b, '"')
	}
	if m.SequenceID != 0 {
		b = append(b, `,"sequence_id":`...)
		b = strconv.AppendInt(b, m.SequenceID, 10)
	}
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(m.Attempt), 10)
	b = append(b, `,"created_at":`...)
	b = created.AppendFormat(b, `"`+time.RFC3339Nano+`"`)
	if len(m.Headers) > 0 {
		// encoding/json writes a map's keys sorted.
		for i, name := range slices.Sorted(maps.Keys(m.Headers)) {
			sep := `,"`
			if i == 0 {
				sep = `,"headers":{"`
			}
			b = appendField(b, sep, name)
			b = appendField(b, `":"`, m.Headers[name])
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	b = append(b, `,"payload":`...)
	buf := bytes.NewBuffer(b)
	if err := json.Compact(buf, m.Payload); err != nil {
		return nil, false // json.Marshal reports it
	}
	return append(buf.Bytes(), '}'), true
}

func appendField(b []byte, prefix, value string) []byte {
	return append(append(b, prefix...), value...)
}

// plain is a string encoding/json writes as it is: printable ASCII
// without the quote, the backslash and the HTML characters it escapes.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x80, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// needsEscape is a payload in which json.Marshal would escape something
// while compacting it: <, >, & and the line and paragraph separators
// U+2028 and U+2029 (whose UTF-8 starts with 0xE2; any 0xE2 is left to
// json.Marshal).
func needsEscape(payload []byte) bool {
	for _, c := range payload {
		if c == '<' || c == '>' || c == '&' || c == 0xe2 {
			return true
		}
	}
	return false
}

// PrepareEnvelope returns a Batcher's Prepare for the plugin publishers
// (webhook, lambdainvoke): a message's envelope, or its terminal refusal
// before any call when the payload or the envelope is over maxBytes. name
// prefixes the errors ("webhook: ...").
func PrepareEnvelope(name string, maxBytes int) func(*outboxtype.Message) ([]byte, int, *Result) {
	return PrepareBody(name, "envelope", maxBytes, EncodeEnvelope)
}

// PrepareBody is PrepareEnvelope for another encoding of the message,
// which the errors call what (such as "CloudEvent").
func PrepareBody(name, what string, maxBytes int, encode func(*outboxtype.Message) ([]byte, error)) func(*outboxtype.Message) ([]byte, int, *Result) {
	refuse := func(r Result) ([]byte, int, *Result) { return nil, 0, &r }
	tooLarge := func(size int, what string) Result {
		return Fail(outboxtype.CodePayloadTooLarge,
			fmt.Errorf("%s: the %s is %d bytes, over the target's cap of %d; not sent", name, what, size, maxBytes))
	}
	return func(m *outboxtype.Message) ([]byte, int, *Result) {
		if len(m.Payload) > maxBytes {
			return refuse(tooLarge(len(m.Payload), "payload"))
		}
		body, err := encode(m)
		if err != nil {
			return refuse(Fail(outboxtype.CodeInvalidPayload, fmt.Errorf("%s: encode the %s: %w", name, what, err)))
		}
		if len(body) > maxBytes {
			return refuse(tooLarge(len(body), what))
		}
		return body, len(body), nil
	}
}
