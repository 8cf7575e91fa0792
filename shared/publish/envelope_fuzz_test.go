package publish_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
)

// FuzzEncodeEnvelope feeds EncodeEnvelope arbitrary message fields and any
// valid JSON payload: it must never panic, and what it writes must decode
// to the envelope of the message — string fields as encoding/json coerces
// them (each invalid UTF-8 byte becomes U+FFFD), the payload equal as JSON.
// A creation time outside the years 0–9999 has no RFC 3339 form: that, and
// only that, is an error (PostgreSQL's timestamptz reaches further).
func FuzzEncodeEnvelope(f *testing.F) {
	f.Add("billing", "invoice_paid", "tenant-1", "order-42-paid", "order-42", int64(7), 3,
		int64(1735787045), int64(123456789), "x-request-id", "abc", []byte(`{"amount":1299,"currency":"EUR"}`))
	f.Add("", "", "", "", "", int64(0), 0, int64(0), int64(0), "", "", []byte(`null`))
	f.Add("ns\xff", "<topic>&", "\u2028", "key\x00", "k\"\\", int64(-1), -1, int64(-62135596800), int64(-1),
		"h\xfe", "v\n", []byte(` [1, 2.50, "\u00e9", {"a":{}}] `))
	f.Add("a", "b", "", "", "", int64(1), 1, int64(253402300800), int64(0), "", "", []byte(`"string payload"`))
	// Plain fields and payloads: the reflection-free path, headers sorted.
	f.Add("billing", "invoice_paid", "t", "", "o", int64(0), 1, int64(1735787045), int64(0), "b-first", "v", []byte(`{"a": [1, 2], "b": {"c": "d e"}}`))
	f.Add("billing", "invoice_paid", "", "d", "", int64(9), 2, int64(-1), int64(999999999), "a", "", []byte("\n\t{ \"x\" : \"\u00e9\" }"))
	f.Add("n", "t", "", "", "", int64(0), 1, int64(0), int64(1), "", "", []byte(`{"s":"\u2028"}`))
	f.Fuzz(func(t *testing.T, namespace, topic, tenant, dedupeKey, orderingKey string, sequenceID int64, attempt int,
		createdSeconds, createdNanos int64, headerName, headerValue string, payload []byte) {
		if !json.Valid(payload) {
			t.Skip("payloads are valid JSON (they come from a jsonb column)")
		}
		created := time.Unix(createdSeconds, createdNanos)
		m := &outboxtype.Message{
			Keys: outboxtype.Keys{
				ID: uuid.NewSHA1(uuid.NameSpaceOID, payload), Namespace: namespace, Topic: topic, TenantID: tenant,
				DedupeKey: dedupeKey, OrderingKey: orderingKey, SequenceID: sequenceID,
			},
			Attempt: attempt, Payload: payload, CreatedAt: created,
		}
		if headerName != "" {
			m.Headers = map[string]string{headerName: headerValue, "x-fixed": "1"}
		}

		body, err := publish.EncodeEnvelope(m)
		if year := created.UTC().Year(); year < 0 || year > 9999 {
			if err == nil {
				t.Fatalf("created year %d encoded without error", year)
			}
			return
		}
		if err != nil {
			t.Fatalf("EncodeEnvelope: %v", err)
		}
		// The reflection-free encoding must write what json.Marshal writes.
		if want, err := json.Marshal(publish.NewEnvelope(m)); err != nil || !bytes.Equal(body, want) {
			t.Fatalf("EncodeEnvelope wrote\n%s\njson.Marshal writes\n%s (%v)", body, want, err)
		}
		if !json.Valid(body) || (!utf8.Valid(body) && utf8.Valid(payload)) {
			// Invalid UTF-8 inside the payload's strings passes through a
			// RawMessage; anywhere else it is a bug.
			t.Fatalf("output is not valid JSON, or not UTF-8 for a UTF-8 payload: %q", body)
		}

		var got publish.Envelope
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("output does not decode: %v\n%s", err, body)
		}
		want := publish.NewEnvelope(m)
		for _, s := range []*string{&want.ID, &want.Key, &want.Namespace, &want.Topic, &want.TenantID, &want.DedupeKey, &want.OrderingKey} {
			*s = coerceUTF8(*s)
		}
		if len(want.Headers) > 0 {
			coerced := map[string]string{}
			for k, v := range want.Headers {
				coerced[coerceUTF8(k)] = coerceUTF8(v)
			}
			if len(coerced) != len(want.Headers) {
				t.Skip("two header names coerce to the same text")
			}
			want.Headers = coerced
		}
		if !got.CreatedAt.Equal(want.CreatedAt) {
			t.Fatalf("created_at %s, want %s", got.CreatedAt, want.CreatedAt)
		}
		if !jsonEqual(t, got.Payload, want.Payload) {
			t.Fatalf("payload %s, want %s", got.Payload, want.Payload)
		}
		got.CreatedAt, want.CreatedAt = time.Time{}, time.Time{}
		got.Payload, want.Payload = nil, nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
		}
	})
}

// coerceUTF8 is what encoding/json does to a string: every byte that is not
// part of valid UTF-8 becomes U+FFFD.
func coerceUTF8(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		b.WriteRune(r) // RuneError for an invalid byte, with size 1
		i += size
	}
	return b.String()
}

// jsonEqual compares two JSON texts as values (numbers exactly, as text).
func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	decode := func(raw []byte) any {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("decode %q: %v", raw, err)
		}
		return v
	}
	return reflect.DeepEqual(decode(a), decode(b))
}
