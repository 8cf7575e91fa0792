// Package headers holds the message header names the dispatcher reserves
// for itself and its targets. It imports only the standard library, so the
// dispatcher's route table checks its static headers against the same rule
// as the producer API (outbox.ReservedHeader) without linking pgx.
package headers

import "strings"

// reservedPrefixes belong to the dispatcher and its targets: the outbox's
// own attributes, the Standard Webhooks headers, and the prefixes SNS
// reserves for itself.
var reservedPrefixes = []string{"outbox", "webhook-", "aws.", "amazon.", "x-amz"}

// Reserved reports whether a header name, in any case, is reserved by the
// dispatcher.
func Reserved(name string) bool {
	lower := strings.ToLower(name)
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(lower, p) {
			return true
		}
	}
	switch lower {
	case "content-type", "content-length", "host", "idempotency-key", "user-agent", "connection", "transfer-encoding":
		return true
	}
	return false
}
