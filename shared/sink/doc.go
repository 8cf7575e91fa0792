// Package sink is the reference receiver for the dispatcher's HTTP plugin
// deliveries (package shared/publish/webhook): an http.Handler that verifies
// the Standard Webhooks signature, decodes the [publish.Envelope],
// deduplicates on the webhook-id and calls the plugin author's [Handler].
// The dispatcher's local sink runs it too.
//
// # What it answers, and what the dispatcher makes of it
//
//	200 {"status":"delivered"}   the handler succeeded                     delivered
//	200 {"status":"duplicate"}   this webhook-id was handled before;       delivered
//	    + Outbox-Duplicate: true the handler did not run
//	400                          missing or malformed webhook headers,     terminal
//	                             or a body that is not an envelope
//	401                          bad signature, or a timestamp outside     terminal
//	                             the tolerance (a forgery or a replay
//	                             must not be retried)
//	405, 413                     not a POST; a body over the size limit    terminal
//	4xx from Reject              the handler refused the message           terminal
//	429 + Retry-After            the handler returned RetryLater           retryable
//	500                          the handler failed (or panicked), or      retryable
//	                             its success could not be recorded
//	503                          the Deduper is unavailable, or an         retryable
//	                             offloaded payload could not be fetched
//
// A payload the route offloaded to S3 (the envelope's payload null, its
// offload field set) is fetched from the presigned URL before the handler
// runs, and handed to it as the envelope's Payload: handlers see every
// payload the same way, and Offload says it travelled through S3.
//
// A 500's body says only that the handler failed; the error itself goes to
// the receiver's log (WithLogger), not to the network. A Reject or RetryLater
// error's text is sent back: the author chose it for the sender's operator.
//
// # Exactly once, in effect
//
// The dispatcher delivers at least once: a message whose answer was lost is
// sent again, with the same webhook-id. The Deduper turns that into "the
// handler's effects happen once":
//
//	Begin(webhook-id) ──► duplicate? ──yes──► 200 duplicate
//	        │ no (the id is now held; a concurrent Begin of the same id waits)
//	        ▼
//	     handler ──error──► Rollback (the id is free again) ──► 4xx / 429 / 500
//	        │ ok
//	        ▼
//	     Commit (the id is recorded as handled) ──► 200 delivered
//
// With [NewPostgresDeduper], Begin opens a transaction and inserts the
// webhook-id in it; the handler reaches that transaction through [Tx] and
// makes its own writes in it, so the id and the effects commit together or
// not at all: a crash anywhere leaves either both or neither, and the retry
// that follows is either a duplicate or a clean first run. That is the
// exactly-once-in-effect receiver. The costs: the handler holds a pooled
// connection and an open transaction for as long as it runs (keep handlers
// short, and size the pool for the deliveries in flight), a concurrent
// duplicate waits on the row lock until the first finishes, and effects
// outside the database (an HTTP call, an email) are still at least once —
// make those idempotent on the envelope's key too.
//
// [NewMemoryDeduper] keeps ids in the process: for tests and local
// development. It forgets everything on restart, is per process, and records
// the id after the handler returns, so a crash between the two runs the
// handler again.
//
// Purge old ids ([PostgresDeduper.Purge]) only once the dispatcher can no
// longer send them: after the routes' retry span and any dead-letter replay
// window.
package sink
