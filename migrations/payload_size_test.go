package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// A payload's size is what PostgreSQL stores and returns, not the text the
// producer sent: 1e131071 is eight bytes and reads back as 131,072 digits.
// The limit holds that size, payload_bytes records it, and enqueue and
// enqueue_batch measure alike.
func TestPayloadsAreMeasuredAsStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	producer := pgtest.Pool(t, db.LoginAs(t, "outbox_producer"))
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.limits SET max_payload_bytes = 100`); err != nil {
		t.Fatal(err)
	}
	calls := map[string]string{
		"enqueue":       `SELECT outbox.enqueue('billing', 'usage', $1::jsonb)`,
		"enqueue_batch": `SELECT outbox.enqueue_batch(ARRAY['billing'], ARRAY['usage'], ARRAY[$1::text])`,
	}
	for _, c := range []struct {
		name, payload string
		stored        int    // bytes as stored, when accepted
		refused       string // the reason, when refused
	}{
		{"exponents written out", `{"a":1e3,"b":[2.50,1E-2]}`, len(`{"a": 1000, "b": [2.50, 0.01]}`), ""},
		{"spaces and escapes dropped", `{ "k" :  "\u00e9" ,   "k" : "last" }`, len(`{"k": "last"}`), ""},
		{"short text, long as stored", `[1e30,1e30,1e30,1e30]`, 0, "over the limit of 100"},
		{"a number that prints as 131,072 digits", `[1e131071]`, 0, "beyond ±1e1000"},
		{"a number nearer to zero than 1e-1000", `[1e-1001]`, 0, "nearer to zero"},
	} {
		for call, sql := range calls {
			_, err := producer.Exec(ctx, sql, c.payload)
			if c.refused != "" {
				if sqlstate(err) != "P7004" || !strings.Contains(err.Error(), c.refused) {
					t.Errorf("%s, %s: %v, want P7004 saying %q", c.name, call, err, c.refused)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s, %s: %v", c.name, call, err)
				continue
			}
			var bytes, measured int
			if err := db.Pool.QueryRow(ctx, `SELECT payload_bytes, octet_length(payload::text) FROM outbox.pending ORDER BY id DESC LIMIT 1`).Scan(&bytes, &measured); err != nil {
				t.Fatal(err)
			}
			if bytes != c.stored || measured != c.stored {
				t.Errorf("%s, %s: payload_bytes %d, stored text %d bytes, want %d", c.name, call, bytes, measured, c.stored)
			}
		}
	}
}

// JSON nested deeper than the dispatcher can decode (10,000 levels, Go's
// encoding/json) is refused at enqueue, as the Go producer refuses it, by
// both functions.
func TestPayloadsNestedTooDeepAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	producer := pgtest.Pool(t, db.LoginAs(t, "outbox_producer"))
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.limits SET max_payload_bytes = 1048576`); err != nil {
		t.Fatal(err)
	}
	nested := func(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }
	for _, sql := range []string{
		`SELECT outbox.enqueue('billing', 'usage', $1::jsonb)`,
		`SELECT outbox.enqueue_batch(ARRAY['billing'], ARRAY['usage'], ARRAY[$1::text])`,
	} {
		if _, err := producer.Exec(ctx, sql, nested(10000)); err != nil {
			t.Errorf("10,000 levels (%s): %v, want accepted", sql, err)
		}
		if _, err := producer.Exec(ctx, sql, nested(10001)); sqlstate(err) != "P7004" || !strings.Contains(err.Error(), "more than 10000 deep") {
			t.Errorf("10,001 levels (%s): %v, want P7004 saying more than 10000 deep", sql, err)
		}
	}
}
