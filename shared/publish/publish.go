// Package publish defines how a claimed message reaches its target: a
// Publisher takes a batch of messages for one target and returns one Result
// per message, in order — delivered, retryable or terminal. Partial success
// is data, not an error: a publisher never fails a whole batch with one error.
//
// Error codes are explicit constants, mapped from AWS error codes, per-entry
// error codes and HTTP statuses in one place per publisher; never from the
// text of an error.
//
// The implementations live in sub-packages (sns, eventbridge, webhook,
// lambdainvoke); publishtest is the conformance suite they all pass.
package publish

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
)

// Publisher delivers messages to one target.
type Publisher interface {
	// Publish delivers msgs and returns exactly len(msgs) results, result i
	// for msgs[i]. It honours ctx: when ctx ends, messages not yet accepted
	// by the target come back Retryable.
	Publish(ctx context.Context, msgs []*lease.Message) []Result
}

// Code says why a message was not delivered.
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
)

// Codes lists every code, for documentation and tools; the README's error
// table is checked against it.
var Codes = []Code{
	CodeThrottled, CodeTimeout, CodeNetwork, CodeTarget5xx, CodeCanceled,
	CodeTargetRejected, CodeAccessDenied, CodeTargetNotFound, CodePayloadTooLarge,
	CodeInvalidPayload, CodeNoRoute, CodeFunctionError,
}

// Kind is a Result's outcome.
type Kind uint8

const (
	// Delivered: the target accepted the message.
	Delivered Kind = iota + 1
	// Retryable: not delivered this time; try again later.
	Retryable
	// Terminal: will never be delivered as it is.
	Terminal
)

func (k Kind) String() string {
	switch k {
	case Delivered:
		return "delivered"
	case Retryable:
		return "retryable"
	case Terminal:
		return "terminal"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Result is what happened to one message.
type Result struct {
	Kind Kind
	// TargetRef is the target's id for a delivery: an SNS MessageId, an
	// EventBridge EventId, an HTTP status.
	TargetRef string
	// Code and Err explain a Retryable or Terminal result.
	Code Code
	Err  error
	// RetryAfter is the target's own request to wait (HTTP Retry-After),
	// 0 when it made none.
	RetryAfter time.Duration
}

// Ok is a delivered result.
func Ok(targetRef string) Result { return Result{Kind: Delivered, TargetRef: targetRef} }

// Retry is a retryable result.
func Retry(code Code, err error, retryAfter time.Duration) Result {
	return Result{Kind: Retryable, Code: code, Err: err, RetryAfter: retryAfter}
}

// Fail is a terminal result.
func Fail(code Code, err error) Result { return Result{Kind: Terminal, Code: code, Err: err} }

// Fill returns n copies of r: the answer for every message of a call that
// failed as a whole.
func Fill(n int, r Result) []Result {
	out := make([]Result, n)
	for i := range out {
		out[i] = r
	}
	return out
}

// ContextResult classifies an error from a call made under ctx when the
// call's own deadline or the invocation's ran out: CodeTimeout when the
// call's timeout expired, CodeCanceled when the caller's context ended. ok is
// false when err has nothing to do with the context.
func ContextResult(parent context.Context, err error) (Result, bool) {
	switch {
	case parent.Err() != nil:
		return Retry(CodeCanceled, fmt.Errorf("invocation ended before the target answered: %w", err), 0), true
	case errors.Is(err, context.DeadlineExceeded):
		return Retry(CodeTimeout, err, 0), true
	case errors.Is(err, context.Canceled):
		return Retry(CodeCanceled, err, 0), true
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return Retry(CodeTimeout, err, 0), true
	}
	return Result{}, false
}
