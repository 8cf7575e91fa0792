package sns

// This file is the one place where SNS's answers become our codes.
//
// # Configuration-class failures
//
// These say that the dispatcher's own setup is wrong, not the message: no
// message gets through until an operator fixes it, and every message does
// once it is fixed. They have two codes, whatever shape the failure takes:
//
//	ACCESS_DENIED      no credentials, or credentials SNS will not take, or
//	                   an identity that may not publish to the topic:
//	  - the SDK could not get credentials at all (awserr.CredentialsUnavailable:
//	    none configured, instance metadata or the container endpoint
//	    unreachable or without a role, STS refusing the role); nothing was
//	    sent — retryable
//	  - ExpiredToken, ExpiredTokenException, RequestExpired — retryable
//	  - InvalidClientTokenId, UnrecognizedClientException, InvalidSignatureException,
//	    SignatureDoesNotMatch, IncompleteSignature, AuthFailure,
//	    MissingAuthenticationToken(Exception) (an unsigned request),
//	    AccessDenied(Exception), AuthorizationError (IAM or the topic
//	    policy), NotAuthorized, InvalidSecurity, OptInRequired, and KMS's
//	    KMSAccessDenied, KMSDisabled, KMSInvalidState, KMSNotFound,
//	    KMSOptInRequired (the topic's key) — terminal
//	  - an answer without a known code, HTTP 401 or 403 — retryable
//	TARGET_NOT_FOUND   no such topic: NotFound, NotFoundException — terminal;
//	                   an answer without a known code, HTTP 404 — retryable
//
// Both are decided from the SDK's error types and SNS's error codes (then
// the HTTP status), never from an error's text, and are the same codes the
// EventBridge and Lambda publishers give the same failures. The kind each
// carries is this package's; what the engine does with a
// configuration-class code is the engine's decision.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/awserr"
)

// EntryError is SNS's refusal of one entry of a PublishBatch call, from the
// answer's Failed list.
type EntryError struct {
	// Code is SNS's error code, e.g. InternalError or InvalidParameter.
	Code string
	// Message is SNS's explanation.
	Message string
	// SenderFault is true when SNS blames the request, false when it blames
	// itself.
	SenderFault bool
}

func (e *EntryError) Error() string {
	side := "SNS's fault"
	if e.SenderFault {
		side = "sender's fault"
	}
	return fmt.Sprintf("sns: entry refused: %s (%s): %s", e.Code, side, e.Message)
}

// errNoAnswer is the error of an entry a successful call answered in neither
// its Successful nor its Failed list.
var errNoAnswer = errors.New("sns: PublishBatch answered neither success nor failure for this entry")

// side is who a failure is blamed on.
type side uint8

const (
	sideUnknown  side = iota // a whole-call error: the status says
	sideSender               // SenderFault true
	sideReceiver             // SenderFault false
)

// failure is what is known of a failed call or entry.
type failure struct {
	// code is the AWS error code, "" when the answer had none.
	code string
	// status is the HTTP status, 0 for a per-entry failure or no answer.
	status int
	side   side
	// tooLong: SNS said the message is over the topic's size cap (see
	// saysTooLong).
	tooLong bool
}

// verdict is how a failure is answered.
type verdict struct {
	kind publish.Kind
	code outboxtype.Code
	// isolate: the call failed as a whole because of something in one of
	// its entries. Split the batch and send the halves, so that one bad
	// message does not take its neighbours with it.
	isolate bool
}

// AWS error codes by what they mean for a message.
var (
	throttlingCodes = codeSet("Throttling", "ThrottlingException", "ThrottledException", "Throttled",
		"RequestLimitExceeded", "TooManyRequestsException", "KMSThrottling", "KMSThrottlingException")
	serviceFaultCodes = codeSet("InternalError", "InternalFailure", "InternalErrorException",
		"ServiceUnavailable", "ServiceUnavailableException")
	// Credentials SNS will not take now but may take on the next attempt:
	// an expired session token (the SDK's credential cache fetches a fresh
	// one; in Lambda a new sandbox has new ones) and a request signed too
	// long ago (the SDK corrects its clock skew). Dead-lettering a batch
	// for these would turn a transient credential hiccup into an operator's
	// replay; the attempt ceiling still ends a persistent one.
	credentialRefreshCodes = codeSet("ExpiredToken", "ExpiredTokenException", "RequestExpired")
	// Credentials that are not valid (in the query protocol's spelling and
	// the JSON protocols'), or an identity that may not publish there.
	accessDeniedCodes = codeSet("AuthorizationError", "AccessDenied", "AccessDeniedException",
		"InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch", "InvalidSignatureException",
		"IncompleteSignature", "MissingAuthenticationToken", "MissingAuthenticationTokenException", "AuthFailure",
		"NotAuthorized", "InvalidSecurity", "OptInRequired",
		"KMSAccessDenied", "KMSDisabled", "KMSInvalidState", "KMSNotFound", "KMSOptInRequired")
	notFoundCodes = codeSet("NotFound", "NotFoundException")
	// SNS answers these for the whole request when it cannot validate one
	// entry; the SDK calls InvalidParameterValue ParameterValueInvalid.
	invalidEntryCodes = codeSet("InvalidParameter", "InvalidParameterValue", "ParameterValueInvalid",
		"ValidationException", "ValidationError")
	tooLongCodes = codeSet("BatchRequestTooLong")
)

// saysTooLong reports whether SNS's message of an invalid-parameter
// refusal says the message is too long ("Invalid parameter: Message too
// long", the answer of Publish and of moto's PublishBatch entries). SNS
// gives that refusal the code of every other invalid parameter,
// InvalidParameter, and no other field: its text is all there is to tell
// a message over the cap from a malformed one, so it is read here, and
// only for those codes.
func saysTooLong(code, message string) bool {
	return invalidEntryCodes[code] && strings.Contains(strings.ToLower(message), "message too long")
}

func codeSet(codes ...string) map[string]bool {
	set := make(map[string]bool, len(codes))
	for _, c := range codes {
		set[c] = true
	}
	return set
}

// classify maps an AWS error code, HTTP status and fault side to a verdict.
// It is the one mapping; the table test in classify_test.go walks it.
//
//	code / status                                       kind       code               isolate
//	throttling codes, HTTP 429                           retryable  THROTTLED
//	InternalError, InternalFailure, ServiceUnavailable,  retryable  TARGET_5XX
//	  HTTP 5xx, SenderFault false
//	ExpiredToken, RequestExpired                         retryable  ACCESS_DENIED
//	AuthorizationError, AccessDenied, KMS*, …            terminal   ACCESS_DENIED
//	NotFound                                             terminal   TARGET_NOT_FOUND
//	InvalidParameter saying "Message too long",          terminal   PAYLOAD_TOO_LARGE  yes
//	  BatchRequestTooLong
//	InvalidParameter, InvalidParameterValue, …           terminal   INVALID_PAYLOAD    yes
//	any other code, SenderFault true                     terminal   TARGET_REJECTED
//	any other code or status, whole call                 retryable  ACCESS_DENIED (401, 403)
//	                                                                TARGET_NOT_FOUND (404)
//	                                                                TARGET_REJECTED (other 4xx)
//	                                                                TARGET_5XX (otherwise)
//
// An unknown whole-call error is retryable on purpose: a lost message is
// lost money, a retried one costs an attempt, and the attempt ceiling ends a
// persistent one in the dead-letter queue anyway. TARGET_REJECTED tells the
// operator SNS refused the call (the error carries SNS's code); TARGET_5XX
// that the answer was not understood. A 401, 403 or 404 with a code this
// table does not know is still a denial or a missing topic, as it is for
// the EventBridge and Lambda publishers.
func classify(f failure) verdict {
	switch {
	case throttlingCodes[f.code] || f.status == http.StatusTooManyRequests:
		return verdict{kind: publish.Retryable, code: outboxtype.CodeThrottled}
	case serviceFaultCodes[f.code] || f.status >= 500 || f.side == sideReceiver:
		return verdict{kind: publish.Retryable, code: outboxtype.CodeTarget5xx}
	case credentialRefreshCodes[f.code]:
		return verdict{kind: publish.Retryable, code: outboxtype.CodeAccessDenied}
	case accessDeniedCodes[f.code]:
		return verdict{kind: publish.Terminal, code: outboxtype.CodeAccessDenied}
	case notFoundCodes[f.code]:
		return verdict{kind: publish.Terminal, code: outboxtype.CodeTargetNotFound}
	case tooLongCodes[f.code] || (invalidEntryCodes[f.code] && f.tooLong):
		return verdict{kind: publish.Terminal, code: outboxtype.CodePayloadTooLarge, isolate: true}
	case invalidEntryCodes[f.code]:
		return verdict{kind: publish.Terminal, code: outboxtype.CodeInvalidPayload, isolate: true}
	case f.side == sideSender:
		return verdict{kind: publish.Terminal, code: outboxtype.CodeTargetRejected}
	case f.status == http.StatusUnauthorized || f.status == http.StatusForbidden:
		return verdict{kind: publish.Retryable, code: outboxtype.CodeAccessDenied}
	case f.status == http.StatusNotFound:
		return verdict{kind: publish.Retryable, code: outboxtype.CodeTargetNotFound}
	case f.status >= 400:
		return verdict{kind: publish.Retryable, code: outboxtype.CodeTargetRejected}
	default:
		return verdict{kind: publish.Retryable, code: outboxtype.CodeTarget5xx}
	}
}

func (v verdict) result(err error) publish.Result {
	if v.kind == publish.Terminal {
		return publish.Fail(v.code, err)
	}
	return publish.Retry(v.code, err, 0)
}

// entryResult answers one entry of the Failed list.
func entryResult(e types.BatchResultErrorEntry) publish.Result {
	f := failure{code: aws.ToString(e.Code), side: sideReceiver}
	if e.SenderFault {
		f.side = sideSender
	}
	f.tooLong = saysTooLong(f.code, aws.ToString(e.Message))
	err := &EntryError{Code: f.code, Message: aws.ToString(e.Message), SenderFault: f.side == sideSender}
	return classify(f).result(err)
}

// callResult answers every entry of a PublishBatch call that returned err.
// parent is the invocation's context (not the call's, which carries the
// call's own timeout), so that a timeout and a cancellation tell apart.
// isolate asks for the batch to be split (see verdict).
func callResult(parent context.Context, err error) (res publish.Result, isolate bool) {
	err = fmt.Errorf("sns: PublishBatch: %w", err)
	// No credentials: nothing was sent, and any code or status in err is a
	// credential source's (the instance metadata's 404, STS's AccessDenied),
	// not SNS's. Retryable, since a credential source recovers — unless
	// the invocation ended meanwhile, which is the truer answer.
	if awserr.CredentialsUnavailable(err) {
		if parent.Err() != nil {
			r, _ := publish.ContextResult(parent, err)
			return r, false
		}
		return publish.Retry(outboxtype.CodeAccessDenied, fmt.Errorf("sns: no credentials to sign the call with: %w", err), 0), false
	}
	var f failure
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		f.code = apiErr.ErrorCode()
		f.tooLong = saysTooLong(f.code, apiErr.ErrorMessage())
	}
	var respErr interface{ HTTPStatusCode() int }
	if errors.As(err, &respErr) {
		f.status = respErr.HTTPStatusCode()
	}
	// SNS answered with a code: the answer decides, even if the context
	// ended meanwhile.
	if f.code != "" && f.code != unknownCode {
		v := classify(f)
		return v.result(err), v.isolate
	}
	if r, ok := publish.ContextResult(parent, err); ok {
		return r, false
	}
	// No answer, or a success whose body could not be read.
	if f.status < 300 && isNetworkError(err) {
		return publish.Retry(outboxtype.CodeNetwork, err, 0), false
	}
	v := classify(f)
	return v.result(err), v.isolate
}

// unknownCode is what the SDK names an error answer without a code.
const unknownCode = "UnknownError"

// isNetworkError reports a failure to reach SNS or to read its answer:
// refused, reset or dropped connections, DNS failures, a body cut short.
// The SDK wraps every failure to send or receive in a RequestSendError.
func isNetworkError(err error) bool {
	var sendErr *smithyhttp.RequestSendError
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.As(err, &sendErr) || errors.As(err, &opErr) || errors.As(err, &dnsErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}
