// Package headers holds the message header names the dispatcher reserves
// for itself and its targets. It imports only the standard library, so the
// dispatcher's route table checks its static headers against the same rule
// as the producer API (outbox.ReservedHeader) without linking pgx.
package headers

import "strings"

// reservedPrefixes belong to the dispatcher and its targets: the outbox's
// own attributes, the Standard Webhooks headers, the CloudEvents HTTP
// binding's attribute headers (ce-*, which a route of format cloudevents
// sends), and the prefixes SNS reserves for itself; and the families a receiver or a proxy in front of
// it trusts for who is calling (x-forwarded-*, proxy-*, sec-*), which a
// producer must never be able to set on a signed delivery.
var reservedPrefixes = []string{"outbox", "webhook-", "ce-", "aws.", "amazon.", "x-amz", "x-forwarded-", "proxy-", "sec-"}

// forbidden are names a producer's header may never take, because a
// webhook delivery would send them as HTTP headers outside its signature:
// credentials and sessions, a client's claimed origin, method overrides,
// and the hop-by-hop headers that change how a request travels. The
// database refuses the same list (migrations/functions/enqueue_batch.sql).
var forbidden = map[string]bool{
	"content-type": true, "content-length": true, "content-encoding": true, "host": true,
	"idempotency-key": true, "user-agent": true, "connection": true, "transfer-encoding": true,
	"authorization": true, "cookie": true, "set-cookie": true,
	"forwarded": true, "x-real-ip": true, "x-client-ip": true, "true-client-ip": true, "via": true, "origin": true,
	"x-http-method-override": true, "x-http-method": true, "x-method-override": true,
	"te": true, "trailer": true, "upgrade": true, "keep-alive": true, "expect": true,
}

// Reserved reports whether a header name, in any case, is reserved by the
// dispatcher.
func Reserved(name string) bool {
	lower := strings.ToLower(name)
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(lower, p) {
			return true
		}
	}
	return forbidden[lower]
}
