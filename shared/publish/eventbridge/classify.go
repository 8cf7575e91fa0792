package eventbridge

// This file is the one place where AWS error codes, per-entry error codes
// and HTTP statuses become results. Nothing is decided from an error's text.
//
// # Configuration-class failures
//
// These say that the dispatcher's own setup is wrong, not the message: no
// message gets through until an operator fixes it, and every message does
// once it is fixed. They have two codes, whatever shape the failure takes:
//
//	ACCESS_DENIED      no credentials, or credentials EventBridge will not
//	                   take, or an identity that may not put events on the bus:
//	  - the SDK could not get credentials at all (awserr.CredentialsUnavailable:
//	    none configured, instance metadata or the container endpoint
//	    unreachable or without a role, STS refusing the role); nothing was
//	    sent — retryable
//	  - ExpiredTokenException, ExpiredToken, RequestExpired — retryable
//	  - UnrecognizedClientException, InvalidClientTokenId,
//	    InvalidSignatureException, SignatureDoesNotMatch, IncompleteSignature,
//	    AuthFailure, MissingAuthenticationToken(Exception) (an unsigned
//	    request), AccessDeniedException, AccessDenied (IAM or the bus's
//	    resource policy), NotAuthorized, NotAuthorizedForSourceException,
//	    NotAuthorizedForDetailTypeException, OptInRequired, and
//	    KMSAccessDeniedException, KMSDisabledException,
//	    KMSInvalidStateException, KMSNotFoundException (the bus's key) —
//	    terminal, for a whole call or one entry
//	  - an answer without a known code, HTTP 401 or 403 — retryable
//	TARGET_NOT_FOUND   no such bus: ResourceNotFoundException,
//	                   InvalidAccountIdException — terminal; an answer
//	                   without a known code, HTTP 404 — retryable
//
// Both are decided from the SDK's error types and EventBridge's error codes
// (then the HTTP status), never from an error's text, and are the same
// codes the SNS and Lambda publishers give the same failures. The kind each
// carries is this package's; what the engine does with a
// configuration-class code is the engine's decision.

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/awserr"
)

// outcome is a Result without its error.
type outcome struct {
	kind publish.Kind
	code outboxtype.Code
}

func (o outcome) result(err error) publish.Result {
	return publish.Result{Kind: o.kind, Code: o.code, Err: err}
}

var (
	throttled      = outcome{publish.Retryable, outboxtype.CodeThrottled}
	serverFault    = outcome{publish.Retryable, outboxtype.CodeTarget5xx}
	retryDenied    = outcome{publish.Retryable, outboxtype.CodeAccessDenied}
	denied         = outcome{publish.Terminal, outboxtype.CodeAccessDenied}
	busNotFound    = outcome{publish.Terminal, outboxtype.CodeTargetNotFound}
	invalid        = outcome{publish.Terminal, outboxtype.CodeInvalidPayload}
	tooLarge       = outcome{publish.Terminal, outboxtype.CodePayloadTooLarge}
	rejected       = outcome{publish.Terminal, outboxtype.CodeTargetRejected}
	retryNotFound  = outcome{publish.Retryable, outboxtype.CodeTargetNotFound}
	unknownFault   = outcome{publish.Retryable, outboxtype.CodeTargetRejected}
	noUsableAnswer = outcome{publish.Retryable, outboxtype.CodeNetwork}
)

// errorCodes maps the AWS error codes EventBridge answers — whole-call error
// types and per-entry ErrorCodes share one vocabulary — to outcomes.
var errorCodes = map[string]outcome{
	// Slow down. EventBridge documents ThrottlingException as retryable per
	// entry; the rest are how AWS front ends and KMS say the same.
	"ThrottlingException":      throttled,
	"Throttling":               throttled,
	"TooManyRequestsException": throttled,
	"RequestLimitExceeded":     throttled,
	"LimitExceededException":   throttled,
	"KMSThrottlingException":   throttled,

	// EventBridge failed on its side. InternalFailure is the documented
	// retryable per-entry code; InternalException is PutEvents' modelled
	// whole-call error.
	"InternalFailure":             serverFault,
	"InternalException":           serverFault,
	"InternalError":               serverFault,
	"InternalServerError":         serverFault,
	"ServiceUnavailable":          serverFault,
	"ServiceUnavailableException": serverFault,

	// The request's credentials were valid but aged out (a session token
	// past expiry, a request signed too long ago). That is about the
	// moment, not the message: the SDK's credential cache refreshes and a
	// new invocation has new credentials, so it is retried — dead-lettering
	// a payment because a token expired mid-batch would be wrong.
	"ExpiredTokenException": retryDenied,
	"ExpiredToken":          retryDenied,
	"RequestExpired":        retryDenied,

	// Denied: the role may not publish there, or the credentials are not
	// valid at all. Retrying cannot help until an operator changes IAM,
	// the key policy or the credentials, so the messages go to the dead
	// letters to be replayed after the fix.
	"AccessDeniedException":               denied,
	"AccessDenied":                        denied,
	"AuthFailure":                         denied,
	"UnrecognizedClientException":         denied,
	"InvalidClientTokenId":                denied,
	"InvalidSignatureException":           denied,
	"SignatureDoesNotMatch":               denied,
	"IncompleteSignature":                 denied,
	"MissingAuthenticationToken":          denied,
	"MissingAuthenticationTokenException": denied,
	"NotAuthorized":                       denied,
	"OptInRequired":                       denied,
	"NotAuthorizedForSourceException":     denied,
	"NotAuthorizedForDetailTypeException": denied,
	"KMSAccessDeniedException":            denied,
	"KMSDisabledException":                denied,
	"KMSInvalidStateException":            denied,
	"KMSNotFoundException":                denied,

	// The bus (or the account its ARN names) does not exist.
	"ResourceNotFoundException": busNotFound,
	"InvalidAccountIdException": busNotFound,

	// Something in the entry, or the request, is invalid. Deterministic:
	// the same request fails the same way every time (see putEvents, which
	// has the entry at fault isolated when a whole call fails so).
	"ValidationException":         invalid,
	"ValidationError":             invalid,
	"SerializationException":      invalid,
	"InvalidArgument":             invalid,
	"MalformedDetail":             invalid,
	"InvalidParameterValue":       invalid,
	"InvalidParameterCombination": invalid,
	"MissingParameter":            invalid,
}

// classifyEntry maps one failed result entry. Codes outside the table are
// terminal TARGET_REJECTED: EventBridge documents every per-entry code but
// InternalFailure and ThrottlingException as not retryable.
func classifyEntry(errorCode, errorMessage string) publish.Result {
	err := &EntryError{ErrorCode: errorCode, ErrorMessage: errorMessage}
	if o, ok := errorCodes[errorCode]; ok {
		return o.result(err)
	}
	return rejected.result(err)
}

// classifyCall maps the error of a PutEvents call that failed as a whole;
// parent is the Publish's context, to tell the call's own timeout (TIMEOUT)
// from the invocation's end (CANCELED). In order:
//
//  0. credentials that could not be had (awserr.CredentialsUnavailable):
//     retryable ACCESS_DENIED, since a credential source (IMDS, the
//     container endpoint, STS) recovers — or CANCELED when the invocation
//     ended meanwhile. Nothing was sent, and whatever code or status err
//     carries is the credential source's, not EventBridge's, so this comes
//     before everything else;
//  1. an AWS error code in the table decides, whatever else happened: the
//     service answered, so that answer is the truth;
//  2. the call's timeout or the invocation's end: publish.ContextResult;
//  3. an answer with an unknown or missing code goes by HTTP status: 429
//     THROTTLED, 5xx TARGET_5XX, 413 a terminal PAYLOAD_TOO_LARGE (the
//     request is too big, deterministically); otherwise retryable, since an
//     unknown code is likelier a new AWS error than a bad message and the
//     route's retry ceiling bounds the cost: 401 and 403 ACCESS_DENIED, 404
//     TARGET_NOT_FOUND, other 4xx TARGET_REJECTED, and a 2xx or 3xx whose
//     body could not be read TARGET_5XX;
//  4. the SDK refusing the input before sending it (our bug, deterministic):
//     terminal INVALID_PAYLOAD;
//  5. anything else got no usable answer — a refused, reset or dropped
//     connection, or an error this table does not know: retryable NETWORK.
func classifyCall(parent context.Context, err error) publish.Result {
	if awserr.CredentialsUnavailable(err) {
		if parent.Err() != nil {
			r, _ := publish.ContextResult(parent, err)
			return r
		}
		return retryDenied.result(fmt.Errorf("eventbridge: no credentials to sign the call with: %w", err))
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		if o, ok := errorCodes[apiErr.ErrorCode()]; ok {
			return o.result(err)
		}
	}
	if r, ok := publish.ContextResult(parent, err); ok {
		return r
	}
	// The SDK wraps transport failures in a ResponseError too, with status
	// 0: only a real status is an answer.
	var respErr *awshttp.ResponseError
	if errors.As(err, &respErr) && respErr.HTTPStatusCode() > 0 {
		return byStatus(respErr.HTTPStatusCode()).result(err)
	}
	var paramsErr smithy.InvalidParamsError
	var serErr *smithy.SerializationError
	if errors.As(err, &paramsErr) || errors.As(err, &serErr) {
		return invalid.result(err)
	}
	// Transport failures (smithyhttp.RequestSendError, net.Error) land
	// here, and so does whatever this table does not know.
	return noUsableAnswer.result(err)
}

// byStatus is step 3 of classifyCall.
func byStatus(status int) outcome {
	switch {
	case status == http.StatusTooManyRequests:
		return throttled
	case status >= 500:
		return serverFault
	case status == http.StatusRequestEntityTooLarge:
		return tooLarge
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return retryDenied
	case status == http.StatusNotFound:
		return retryNotFound
	case status >= 400:
		return unknownFault
	}
	return serverFault
}

// refusal maps a message refused before any call, by the sentinel its error
// wraps.
func refusal(err error) publish.Result {
	if errors.Is(err, ErrEntryTooLarge) {
		return tooLarge.result(err)
	}
	return invalid.result(err)
}
