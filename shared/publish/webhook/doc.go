// Package webhook is the HTTP plugin publisher: it POSTs each message's
// [publish.Envelope] to one URL, signed per the Standard Webhooks scheme
// (https://www.standardwebhooks.com), and maps the answer to a
// [publish.Result]. Webhooks are per message: one request per message, a
// bounded number in flight ([Config.Concurrency]). The messages of one
// ordering key go one after another, each only once the receiver accepted
// the one before; at the first it does not accept, the rest of the key is
// not sent (publish.Released). Different keys go side by side.
//
// # The request
//
//	POST <Config.URL>
//	Content-Type:      application/json
//	webhook-id:        <stable key>  (the dedupe key, else the message id)
//	webhook-timestamp: <unix seconds of this attempt>
//	webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">
//	Idempotency-Key:   <stable key>
//	X-Amzn-Trace-Id:   <the producer's trace header, when it stored one>
//	User-Agent:        <Config.UserAgent>
//	...                Config.Headers, then the message's own headers
//
//	{"id":"…","key":"…","namespace":"…","topic":"…","attempt":1,"payload":{…},…}
//
// The webhook-id and Idempotency-Key are the same on every attempt and every
// replay of a message, so a receiver deduplicates on either (package
// shared/sink is the reference receiver). The body is the envelope of
// [publish.EncodeEnvelope], which also carries every message header: the
// envelope is authoritative. A message header whose name or value is not
// valid in HTTP, or that would replace a header above (or a hop-by-hop one
// such as Connection), is carried in the envelope only; the static
// Config.Headers win over a message's headers of the same name, so a producer
// cannot replace, say, the receiver's Authorization.
//
// A message whose payload a route offloaded to S3 (package offload) has
// the envelope's payload null and its offload field pointing at the object,
// with a presigned GET URL; the request carries HeaderPayloadOffloaded.
//
// With Config.CloudEvents (route format cloudevents) the request is a
// CloudEvent in the HTTP binding's binary mode: the body is the payload as
// stored, not the envelope, and the headers above gain ce-specversion,
// ce-id (the webhook-id), ce-source, ce-type, ce-time and, when the message
// has them, ce-partitionkey, ce-sequence and ce-tenantid (package
// cloudevent). The signature still covers the body; a message header named
// ce-* is never sent.
//
// # Outcomes
//
// Statuses map in one place (classifyResponse):
//
//	2xx                 delivered, target_ref "HTTP <status>"
//	408                 retryable TIMEOUT
//	425, 5xx            retryable TARGET_5XX
//	429                 retryable THROTTLED
//	401, 403            terminal  ACCESS_DENIED
//	404, 410            terminal  TARGET_NOT_FOUND
//	other 4xx (409, …)  terminal  TARGET_REJECTED
//	3xx                 terminal  TARGET_REJECTED (redirects are not followed)
//	anything else       retryable TARGET_5XX (not an HTTP status we know)
//
// A retryable answer's Retry-After (delta-seconds or an HTTP-date) becomes
// the result's RetryAfter, capped at retry.MaxRetryAfter (24 hours).
//
// 404 and 410 are "other 4xx" and so terminal, but they say the URL is wrong
// rather than that the message is: TARGET_NOT_FOUND sends the operator to the
// route's configuration instead of the payload.
//
// Every non-2xx error is a [*StatusError] carrying the status and the first
// bytes of the response body (at most 512, reduced to printable text), so
// the attempts archive shows what the receiver said.
//
// A message whose envelope is over Config.MaxPayloadBytes is terminal
// PAYLOAD_TOO_LARGE, and one whose payload is not JSON terminal
// INVALID_PAYLOAD, both without a request.
//
// Errors before an answer are classified by type, never by their text:
//
//	the request's timeout (Config.Timeout)   retryable TIMEOUT
//	the caller's context ended               retryable CANCELED (publish.ContextResult)
//	refused, reset, EOF, dropped, DNS, TLS   retryable NETWORK
//
// A TLS certificate the dispatcher rejects (expired, unknown authority,
// wrong host) is retryable NETWORK with an error that says so, not terminal:
// nothing was delivered, and the usual cause, an expired or half-rotated
// certificate, is fixed on the receiver's side within hours, which the
// route's retry policy spans; a terminal code would dead-letter every message
// of the outage for an operator to replay. A certificate that stays wrong
// exhausts the policy and dead-letters just the same.
//
// # Connections
//
// One *http.Client per target, built once per cold start and reused by every
// call and invocation. Response bodies are drained (up to 64 KiB) and closed
// so that connections go back to the pool. The client [New] builds keeps
// Concurrency idle connections to the target and opens at most that many.
// Requests carry an Idempotency-Key and can replay their body, so the
// transport may resend one whose pooled connection the server had closed
// while the Lambda environment was frozen, instead of failing it. Redirects
// are never followed, whichever client is given: following one would send a
// signed body somewhere the route does not name.
package webhook
