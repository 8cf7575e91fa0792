package sink

import (
	"net/http"
	"time"
)

// HandlerError is a handler's deliberate answer: a terminal refusal (Reject)
// or a request to retry later (RetryLater). The receiver answers with its
// Status (and Retry-After), and sends its text back to the sender.
type HandlerError struct {
	// Status is the HTTP status answered: a terminal 4xx, or 429.
	Status int
	// RetryAfter is sent as Retry-After (429 only).
	RetryAfter time.Duration
	// Err is the reason.
	Err error
}

func (e *HandlerError) Error() string {
	if e.Err == nil {
		return http.StatusText(e.Status)
	}
	return e.Err.Error()
}

// Unwrap returns the reason.
func (e *HandlerError) Unwrap() error { return e.Err }

// Reject refuses a delivery for good: the dispatcher dead-letters it
// (TARGET_REJECTED, or TARGET_NOT_FOUND / ACCESS_DENIED for 404, 410, 401 and
// 403). status must be a 4xx the dispatcher treats as terminal; anything
// else (a 2xx, 5xx, or the retryable 408, 425 and 429) is answered as 422
// Unprocessable Entity, because a rejection must never be retried by
// accident.
func Reject(status int, err error) error {
	if status < 400 || status > 499 || status == http.StatusRequestTimeout ||
		status == http.StatusTooEarly || status == http.StatusTooManyRequests {
		status = http.StatusUnprocessableEntity
	}
	return &HandlerError{Status: status, Err: err}
}

// RetryLater asks the dispatcher to deliver again after at least after
// (429 with Retry-After; the dispatcher's backoff may wait longer). A
// non-positive after sends no Retry-After.
func RetryLater(after time.Duration, err error) error {
	return &HandlerError{Status: http.StatusTooManyRequests, RetryAfter: max(after, 0), Err: err}
}
