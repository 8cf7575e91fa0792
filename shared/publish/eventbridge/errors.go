package eventbridge

import (
	"errors"
	"fmt"
)

// Why a message was refused before any call; each refusal's error wraps one.
var (
	// ErrEntryTooLarge: the entry is over Config.MaxEntryBytes by AWS's
	// entry-size formula (PAYLOAD_TOO_LARGE).
	ErrEntryTooLarge = errors.New("eventbridge: entry over the size cap")
	// ErrDetailNotObject: the payload is not a JSON object, which
	// EventBridge requires of Detail (INVALID_PAYLOAD).
	ErrDetailNotObject = errors.New("eventbridge: payload is not a JSON object")
	// ErrInvalidSource: the substituted Source breaks EventBridge's rules
	// (INVALID_PAYLOAD).
	ErrInvalidSource = errors.New("eventbridge: invalid Source")
	// ErrInvalidDetailType: the substituted DetailType breaks EventBridge's
	// rules (INVALID_PAYLOAD).
	ErrInvalidDetailType = errors.New("eventbridge: invalid DetailType")
	// ErrNoCloudEvent: the message cannot be written as a CloudEvent
	// (route format cloudevents; INVALID_PAYLOAD).
	ErrNoCloudEvent = errors.New("eventbridge: the message cannot be written as a CloudEvent")
)

// ErrMissingResult: EventBridge's answer had no usable result for an entry
// it was sent, so whether it was accepted is unknown (retryable TARGET_5XX).
var ErrMissingResult = errors.New("eventbridge: no result for the entry")

// EntryError is EventBridge's refusal of one entry of a PutEvents call.
type EntryError struct {
	// ErrorCode and ErrorMessage are EventBridge's, verbatim, e.g.
	// "MalformedDetail" and "Detail is malformed.".
	ErrorCode    string
	ErrorMessage string
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("eventbridge: PutEvents refused the entry: %s: %s", e.ErrorCode, e.ErrorMessage)
}
