package outboxtype

// Code says why a message was not delivered. Publishers answer with it, the
// engine holds or retries by it, and the attempts archive and the dead
// letters record it.
type Code string

// The codes. Each is retryable or terminal by nature, but a publisher
// decides per result: a throttled call is retried, an access denial is not.
const (
	// Retryable by nature.
	CodeThrottled Code = "THROTTLED"  // the target asked us to slow down
	CodeTimeout   Code = "TIMEOUT"    // no answer within the route's timeout
	CodeNetwork   Code = "NETWORK"    // connection refused, reset or dropped
	CodeTarget5xx Code = "TARGET_5XX" // the target failed on its side
	CodeCanceled  Code = "CANCELED"   // the invocation ran out of time first

	// Terminal by nature.
	CodeTargetRejected  Code = "TARGET_REJECTED"   // the target refused this message (4xx, sender fault)
	CodeAccessDenied    Code = "ACCESS_DENIED"     // our credentials may not publish there
	CodeTargetNotFound  Code = "TARGET_NOT_FOUND"  // the topic, bus, URL or function does not exist
	CodePayloadTooLarge Code = "PAYLOAD_TOO_LARGE" // over the target's size cap; never sent
	CodeInvalidPayload  Code = "INVALID_PAYLOAD"   // fails the route's schema or the target's rules; never sent
	CodeNoRoute         Code = "NO_ROUTE"          // no route matches the namespace and topic
	CodeFunctionError   Code = "FUNCTION_ERROR"    // a plugin function failed (retryable unless it marked the failure terminal)
	CodeInvalidMessage  Code = "INVALID_MESSAGE"   // the stored message cannot be decoded (e.g. a header that is not a string); never sent
)

// Codes lists every code, for documentation and tools; docs/CONFIGURATION.md's error
// table is checked against it.
var Codes = []Code{
	CodeThrottled, CodeTimeout, CodeNetwork, CodeTarget5xx, CodeCanceled,
	CodeTargetRejected, CodeAccessDenied, CodeTargetNotFound, CodePayloadTooLarge,
	CodeInvalidPayload, CodeNoRoute, CodeFunctionError, CodeInvalidMessage,
}

// Outcome is what the engine records for a claimed message.
type Outcome string

const (
	// OutcomeDispatched: delivered; the message leaves the queue.
	OutcomeDispatched Outcome = "DISPATCHED"
	// OutcomeRetryable: not delivered this time; due again at the
	// result's retry time.
	OutcomeRetryable Outcome = "RETRYABLE"
	// OutcomeFailed: will never be delivered as is; moved to the dead
	// letters.
	OutcomeFailed Outcome = "FAILED"
	// OutcomeReleased: given back untouched — not sent, no attempt charged,
	// nothing archived. The rest of an ordered run after a message that was
	// not delivered, or a batch the dispatcher could not work on.
	OutcomeReleased Outcome = "RELEASED"
)

// OnDead is a route's policy for an ordered message that dies.
type OnDead string

const (
	// OnDeadSkip lets the key's next message go: the dead one is skipped
	// (the default).
	OnDeadSkip OnDead = "skip"
	// OnDeadPark holds the key: its later messages wait until the dead one
	// is replayed (it goes first) or discarded.
	OnDeadPark OnDead = "park"
)

// Status is what the database did with one outcome.
type Status string

const (
	// StatusOK: the outcome was recorded.
	StatusOK Status = "ok"
	// StatusLeaseLost: the lease was no longer this worker's; nothing was
	// written for the message.
	StatusLeaseLost Status = "lease_lost"
	// StatusDead: a Retryable outcome at the attempt ceiling; the message
	// was moved to the dead letters instead.
	StatusDead Status = "dead"
	// StatusDoubleDispatch: a Dispatched outcome for a message already
	// recorded as dispatched (the double-delivery backstop). The message
	// left the queue without a second DISPATCHED outcome; the rest of the
	// batch was recorded as usual. It means a delivery happened twice: a
	// bug to report.
	StatusDoubleDispatch Status = "double_dispatch"
)
