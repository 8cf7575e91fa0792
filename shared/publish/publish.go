// Package publish defines how a claimed message reaches its target: a
// Publisher takes a batch of messages for one target and returns one Result
// per message, in order — delivered, retryable or terminal. Partial success
// is data, not an error: a publisher never fails a whole batch with one error.
//
// Error codes are explicit constants, mapped from AWS error codes, per-entry
// error codes and HTTP statuses in one place per publisher; never from the
// text of an error.
//
// Every publisher delivers through one scheduler, [Batcher], which keeps the
// messages of an ordering key in order (see [Publisher]) while packing calls
// as full as the target allows.
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

	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// Publisher delivers messages to one target.
//
// # Order
//
// Messages that share a Namespace and an OrderingKey form a lane: a claim
// hands out several consecutive messages of one key, and the target must
// see them in SequenceID order, whatever their order in msgs. Each is sent
// only after every earlier message of its lane was accepted — in a later
// call, or earlier in the same call for a target that keeps the order of a
// batch's entries. Different lanes, and messages without an ordering key,
// proceed in parallel.
//
// At the first message of a lane that is not delivered — retryable,
// terminal, or cut off by ctx — the rest of the lane is not sent and comes
// back [Released]; the engine gives those back untouched, to be claimed
// again behind the one that failed. Only messages after a lane's first
// failure are Released; a message without an ordering key never is.
//
// A batch call (SNS PublishBatch, EventBridge PutEvents) may carry entries
// of several lanes and unordered messages together; a lane's entries in one
// call are consecutive and in order. When a call answers an entry as failed
// but a later entry of the same lane in that call as accepted, the later one
// stays Delivered — it was delivered, and sending it again would duplicate
// it — and the lane stops there; the entries after it that were not
// accepted come back Released.
type Publisher interface {
	// Publish delivers msgs and returns exactly len(msgs) results, result i
	// for msgs[i]. It honours ctx: when ctx ends, a message without an
	// ordering key that was not accepted comes back Retryable (CANCELED or
	// TIMEOUT, see ContextResult), and so does the first message of a lane
	// not accepted, the rest of that lane Released.
	Publish(ctx context.Context, msgs []*outboxtype.Message) []Result
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
	// Released: not sent because an earlier message of its ordering key
	// was not delivered; the engine gives it back untouched (no attempt
	// counted), to be claimed again after that message.
	Released
)

// ErrEarlierNotDelivered is the error of every Released result.
var ErrEarlierNotDelivered = errors.New("publish: not sent: an earlier message of its ordering key was not delivered")

func (k Kind) String() string {
	switch k {
	case Delivered:
		return "delivered"
	case Retryable:
		return "retryable"
	case Terminal:
		return "terminal"
	case Released:
		return "released"
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
	Code outboxtype.Code
	Err  error
	// RetryAfter is the target's own request to wait (HTTP Retry-After),
	// 0 when it made none.
	RetryAfter time.Duration
	// Latency is how long the call that carried the message took: a batch
	// call's whole time, shared by its entries; for a message re-sent to
	// isolate a bad entry, the re-send's own time. Zero when no call was
	// made: refused before sending, Released, or cut off by the context
	// before its call.
	Latency time.Duration
}

// Ok is a delivered result.
func Ok(targetRef string) Result { return Result{Kind: Delivered, TargetRef: targetRef} }

// Retry is a retryable result.
func Retry(code outboxtype.Code, err error, retryAfter time.Duration) Result {
	return Result{Kind: Retryable, Code: code, Err: err, RetryAfter: retryAfter}
}

// Fail is a terminal result.
func Fail(code outboxtype.Code, err error) Result {
	return Result{Kind: Terminal, Code: code, Err: err}
}

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
		return Retry(outboxtype.CodeCanceled, fmt.Errorf("invocation ended before the target answered: %w", err), 0), true
	case errors.Is(err, context.DeadlineExceeded):
		return Retry(outboxtype.CodeTimeout, err, 0), true
	case errors.Is(err, context.Canceled):
		return Retry(outboxtype.CodeCanceled, err, 0), true
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return Retry(outboxtype.CodeTimeout, err, 0), true
	}
	return Result{}, false
}
