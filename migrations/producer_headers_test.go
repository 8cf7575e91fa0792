package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// A producer's header that a webhook delivery would send as an HTTP header
// outside its signature — a credential, a claimed client address, a
// method override — is refused at enqueue by the database as the Go
// producer refuses it, by both functions, naming the header; an ordinary
// header is still taken.
func TestHeadersAReceiverWouldTrustAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	producer := pgtest.Pool(t, db.LoginAs(t, "outbox_producer"))
	calls := map[string]string{
		"enqueue":       `SELECT outbox.enqueue('billing', 'usage', '{}'::jsonb, p_headers => $1::jsonb)`,
		"enqueue_batch": `SELECT outbox.enqueue_batch(ARRAY['billing'], ARRAY['usage'], ARRAY['{}'], p_headers => ARRAY[$1::text])`,
	}
	for _, name := range []string{"Authorization", "Cookie", "X-Forwarded-For", "X-HTTP-Method-Override", "forwarded", "Proxy-Authorization", "Upgrade", "ce-id", "Ce-Source"} {
		for call, sql := range calls {
			_, err := producer.Exec(ctx, sql, `{"`+name+`": "forged-by-producer"}`)
			if sqlstate(err) != "P7004" || !strings.Contains(err.Error(), "is reserved") || !strings.Contains(err.Error(), name) {
				t.Errorf("%s with header %s: %v, want P7004 naming it reserved", call, name, err)
			}
		}
	}
	for call, sql := range calls {
		if _, err := producer.Exec(ctx, sql, `{"X-Request-Id": "r-1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`); err != nil {
			t.Errorf("%s with ordinary headers: %v", call, err)
		}
	}
}
