package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outboxkit/dispatcher/shared/outbox/headers"
)

// ErrInvalidMessage is wrapped by every *ValidationError.
var ErrInvalidMessage = errors.New("outbox: invalid message")

// ValidationError says which field of which message was rejected, before
// anything was sent to the database.
type ValidationError struct {
	// Index is the message's position in a batch, or -1 for a single enqueue.
	Index int
	// Field is the rejected field: namespace, topic, payload, tenant_id,
	// dedupe_key, ordering_key, headers, available_at, trace_header or batch.
	Field string
	// Reason says what is wrong with it.
	Reason string
	// InDatabase: the database refused the message, not this package (the
	// database's outbox.limits are stricter than the Producer's Limits).
	// Unlike a refusal before the call, it aborted the caller's transaction.
	InDatabase bool
}

func (e *ValidationError) Error() string {
	if e.InDatabase {
		return fmt.Sprintf("outbox: the database refused the message (the transaction is aborted): %s", e.Reason)
	}
	if e.Index >= 0 {
		return fmt.Sprintf("outbox: invalid message %d: %s %s", e.Index, e.Field, e.Reason)
	}
	return fmt.Sprintf("outbox: invalid message: %s %s", e.Field, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidMessage) true.
func (e *ValidationError) Unwrap() error { return ErrInvalidMessage }

// Limits bound what a producer may enqueue. Zero fields take the default.
type Limits struct {
	// MaxPayloadBytes caps the payload's JSON encoding (default 256 KiB, the
	// default SNS and EventBridge message size).
	MaxPayloadBytes int
	// MaxKeyBytes caps TenantID, DedupeKey and OrderingKey (default 512).
	MaxKeyBytes int
	// MaxHeaders caps the number of headers (default 16).
	MaxHeaders int
	// MaxHeaderValueBytes caps each header value (default 1024).
	MaxHeaderValueBytes int
	// MaxBatch caps the messages in one EnqueueBatch (default 10,000).
	MaxBatch int
	// MaxDelay caps how far ahead AvailableAt may be (default 365 days).
	MaxDelay time.Duration
}

// DefaultLimits are the limits of Enqueue and EnqueueBatch. They are also
// the defaults of the database's own limits (table outbox.limits), which
// hold every producer, in any language: a Producer whose Limits are looser
// than the database's gets its messages refused by the database, with its
// transaction aborted, instead of a *ValidationError before the call.
var DefaultLimits = Limits{
	MaxPayloadBytes:     256 * 1024,
	MaxKeyBytes:         512,
	MaxHeaders:          16,
	MaxHeaderValueBytes: 1024,
	MaxBatch:            10_000,
	MaxDelay:            365 * 24 * time.Hour,
}

func (l Limits) withDefaults() Limits {
	if l.MaxPayloadBytes <= 0 {
		l.MaxPayloadBytes = DefaultLimits.MaxPayloadBytes
	}
	if l.MaxKeyBytes <= 0 {
		l.MaxKeyBytes = DefaultLimits.MaxKeyBytes
	}
	if l.MaxHeaders <= 0 {
		l.MaxHeaders = DefaultLimits.MaxHeaders
	}
	if l.MaxHeaderValueBytes <= 0 {
		l.MaxHeaderValueBytes = DefaultLimits.MaxHeaderValueBytes
	}
	if l.MaxBatch <= 0 {
		l.MaxBatch = DefaultLimits.MaxBatch
	}
	if l.MaxDelay <= 0 {
		l.MaxDelay = DefaultLimits.MaxDelay
	}
	return l
}

// NamePattern is what a namespace or topic must match ("*" is kept for route
// patterns). The database checks only the length, to keep inserts cheap.
var NamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

var headerNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ReservedHeader reports whether a header name is reserved by the dispatcher
// (the rule lives in package headers, which the dispatcher's route table
// shares without linking pgx).
func ReservedHeader(name string) bool { return headers.Reserved(name) }

func (l Limits) validate(m Message, index int) error {
	fail := func(field, format string, args ...any) error {
		return &ValidationError{Index: index, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	for _, f := range []struct{ field, value string }{{"namespace", m.Namespace}, {"topic", m.Topic}} {
		if f.value == "" {
			return fail(f.field, "must not be empty")
		}
		if !NamePattern.MatchString(f.value) {
			return fail(f.field, "%q must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit", f.value)
		}
	}

	if len(m.Payload) == 0 {
		return fail("payload", "must not be empty")
	}
	// A stored document is shorter than its text by spaces and escapes,
	// never by this much: the database parses no longer text either.
	if maxText := maxTextBytes(l.MaxPayloadBytes); len(m.Payload) > maxText {
		return fail("payload", "is %d bytes of JSON text, far over the limit of %d", len(m.Payload), l.MaxPayloadBytes)
	}
	if first := firstNonSpace(m.Payload); first != '{' && first != '[' {
		if !json.Valid(m.Payload) {
			return fail("payload", "is not valid JSON")
		}
		return fail("payload", "must be a JSON object or array, not a %s", jsonKind(first))
	}
	size, problem := storedSize(m.Payload)
	if problem != "" {
		return fail("payload", "%s", problem)
	}
	if size > l.MaxPayloadBytes {
		return fail("payload", "is %d bytes as stored, over the limit of %d", size, l.MaxPayloadBytes)
	}

	for _, f := range []struct{ field, value string }{
		{"tenant_id", m.TenantID}, {"dedupe_key", m.DedupeKey}, {"ordering_key", m.OrderingKey},
	} {
		if err := l.checkKey(f.value); err != "" {
			return fail(f.field, "%s", err)
		}
	}

	if len(m.Headers) > l.MaxHeaders {
		return fail("headers", "has %d entries, more than the limit of %d", len(m.Headers), l.MaxHeaders)
	}
	_, hasTraceParent := m.Headers[headers.TraceParent]
	for name, value := range m.Headers {
		if !headerNamePattern.MatchString(name) {
			return fail("headers", "name %q must be 1-64 characters of letters, digits and _ . -, starting with a letter or digit", name)
		}
		if ReservedHeader(name) {
			return fail("headers", "name %q is reserved for the dispatcher", name)
		}
		if len(value) > l.MaxHeaderValueBytes {
			return fail("headers", "value of %q is %d bytes, over the limit of %d", name, len(value), l.MaxHeaderValueBytes)
		}
		if msg := checkText(value); msg != "" {
			return fail("headers", "value of %q %s", name, msg)
		}
		if msg := headers.TraceContextProblem(name, value, hasTraceParent); msg != "" {
			return fail("headers", "%s", msg)
		}
	}

	if !m.AvailableAt.IsZero() && (m.AvailableAt.Year() < 1 || m.AvailableAt.Year() > 9999) {
		return fail("available_at", "must be between the years 1 and 9999, got %s", m.AvailableAt.Format(time.RFC3339))
	}
	// The database checks the same bound against its own clock, when the
	// statement runs: a bound checked here first and there second holds
	// as long as this clock is not ahead of the database's.
	if latest := time.Now().Add(l.MaxDelay); m.AvailableAt.After(latest) {
		return fail("available_at", "is more than %s ahead (%s)", l.MaxDelay, m.AvailableAt.Format(time.RFC3339))
	}
	if len(m.TraceHeader) > 256 {
		return fail("trace_header", "is %d bytes, over the limit of 256", len(m.TraceHeader))
	}
	for _, r := range m.TraceHeader {
		if r < 0x21 || r > 0x7e {
			return fail("trace_header", "must be printable ASCII without spaces")
		}
	}
	return nil
}

func (l Limits) checkKey(v string) string {
	if v == "" {
		return ""
	}
	if len(v) > l.MaxKeyBytes {
		return fmt.Sprintf("is %d bytes, over the limit of %d", len(v), l.MaxKeyBytes)
	}
	return checkText(v)
}

// checkText rejects what breaks a key or header downstream: invalid UTF-8
// and control characters (a CR or LF would split an HTTP header).
func checkText(v string) string {
	if !utf8.ValidString(v) {
		return "is not valid UTF-8"
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return "contains a control character"
		}
	}
	return ""
}

// maxTextBytes is the longest JSON text parsed for a limit of maxPayload
// stored bytes (outbox.enqueue_batch's bound).
func maxTextBytes(maxPayload int) int {
	return min(8*maxPayload, 1<<30-1)
}

func firstNonSpace(b []byte) byte {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c
	}
	return 0
}

func jsonKind(first byte) string {
	switch first {
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	default:
		return "number"
	}
}
