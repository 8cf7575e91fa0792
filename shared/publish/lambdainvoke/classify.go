package lambdainvoke

// This file is the one place where an invocation's outcome — the Invoke
// API's error, or the function's answer — becomes a Result.
//
// # Configuration-class failures
//
// These say that the dispatcher's own setup is wrong, not the message: no
// message gets through until an operator fixes it, and every message does
// once it is fixed. They have two codes, whatever shape the failure takes:
//
//	ACCESS_DENIED      no credentials, or credentials Lambda will not take,
//	                   or an identity that may not invoke the function:
//	  - the SDK could not get credentials at all (awserr.CredentialsUnavailable:
//	    none configured, instance metadata or the container endpoint
//	    unreachable or without a role, STS refusing the role); nothing was
//	    sent — retryable
//	  - ExpiredTokenException, ExpiredToken, RequestExpired — retryable
//	  - UnrecognizedClientException, InvalidClientTokenId,
//	    InvalidSignatureException, SignatureDoesNotMatch, IncompleteSignature,
//	    AuthFailure, MissingAuthenticationTokenException (an unsigned
//	    request), AccessDeniedException (IAM or the function's resource
//	    policy), AccessDenied, NotAuthorized, OptInRequired,
//	    EC2AccessDeniedException, and KMSAccessDeniedException,
//	    KMSDisabledException, KMSInvalidStateException, KMSNotFoundException
//	    (the function's key) — terminal
//	  - an answer without a known code, HTTP 401 or 403 — terminal
//	TARGET_NOT_FOUND   no such function, version or alias:
//	                   ResourceNotFoundException, or an answer without a
//	                   known code, HTTP 404 — terminal
//
// Both are decided from the SDK's error types and the Invoke API's error
// codes (then the HTTP status), never from an error's text, and are the
// same codes the SNS and EventBridge publishers give the same failures. The
// kind each carries is this package's; what the engine does with a
// configuration-class code is the engine's decision.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/awserr"
)

// Response is the JSON object a plugin function may return to say what
// became of the message (see the package doc). Returning nothing, or
// anything else, means delivered.
type Response struct {
	// Status is StatusDelivered (or "ok", or empty), StatusRejected or
	// StatusRetry.
	Status string `json:"status,omitempty"`
	// Error explains a rejection or a retry; it is recorded with the
	// attempt.
	Error string `json:"error,omitempty"`
	// RetryAfterSeconds asks for a retry no sooner than this (StatusRetry).
	RetryAfterSeconds float64 `json:"retry_after_seconds,omitempty"`
}

// The statuses of a Response.
const (
	StatusDelivered = "delivered"
	StatusOK        = "ok"
	StatusRejected  = "rejected"
	StatusRetry     = "retry"
)

// TerminalError is the error a Go plugin function (aws-lambda-go) returns,
// unwrapped, to refuse a message for good: aws-lambda-go reports its type
// name, "TerminalError", as the errorType, which makes the failure terminal
// FUNCTION_ERROR instead of retryable.
type TerminalError struct {
	// Message is the reason, recorded with the attempt.
	Message string
}

func (e *TerminalError) Error() string { return e.Message }

// terminalErrorType is the errorType that makes a function error terminal.
const terminalErrorType = "TerminalError"

// snippetBytes bounds the text of a plugin's error kept in a result.
const snippetBytes = 512

// classify turns an invocation's outcome into a Result: the Invoke API's
// error, or the function's answer. parent is Publish's context: its end is
// the caller's, not the call timeout's.
func (p *Publisher) classify(parent context.Context, out *lambda.InvokeOutput, err error) publish.Result {
	if err != nil {
		return p.classifyError(parent, err)
	}
	if out == nil {
		return publish.Retry(outboxtype.CodeTarget5xx, p.errorf("the client returned neither an answer nor an error"), 0)
	}
	if out.FunctionError != nil {
		return p.classifyFunctionError(*out.FunctionError, out.Payload)
	}
	return p.classifyResponse(out)
}

func (p *Publisher) classifyError(parent context.Context, err error) publish.Result {
	// No credentials: nothing was sent, and any code or status in err is a
	// credential source's (the instance metadata's 404, STS's AccessDenied),
	// not Lambda's. Retryable, since a credential source recovers — unless
	// the invocation ended meanwhile, which is the truer answer.
	if awserr.CredentialsUnavailable(err) {
		if parent.Err() != nil {
			r, _ := publish.ContextResult(parent, err)
			r.Err = p.errorf("%w", r.Err)
			return r
		}
		return publish.Retry(outboxtype.CodeAccessDenied, p.errorf("no credentials to sign the call with: %w", err), 0)
	}
	wrapped := p.errorf("%w", err)
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		status, header := 0, http.Header(nil)
		var respErr *smithyhttp.ResponseError
		if errors.As(err, &respErr) && respErr.Response != nil {
			status, header = respErr.HTTPStatusCode(), respErr.Response.Header
		}
		return classifyAPIError(apiErr.ErrorCode(), status, header, wrapped)
	}
	if r, ok := publish.ContextResult(parent, err); ok {
		if r.Code == outboxtype.CodeTimeout {
			r.Err = p.errorf("no answer within %s: %w", p.timeout, err)
		} else {
			r.Err = p.errorf("%w", r.Err)
		}
		return r
	}
	// The SDK reports a request that got no answer as a ResponseError with
	// status 0 (a RequestSendError inside); a real status is an answer it
	// could not read as an error shape.
	var respErr *smithyhttp.ResponseError
	if errors.As(err, &respErr) && respErr.Response != nil && respErr.HTTPStatusCode() > 0 {
		return classifyAPIError("", respErr.HTTPStatusCode(), respErr.Response.Header, wrapped)
	}
	return publish.Retry(outboxtype.CodeNetwork, wrapped, 0)
}

// classifyAPIError maps an Invoke API error code, then its HTTP status.
func classifyAPIError(code string, status int, header http.Header, err error) publish.Result {
	wait := retryAfter(header)
	switch code {
	case "TooManyRequestsException", "EC2ThrottledException":
		return publish.Retry(outboxtype.CodeThrottled, err, wait)
	case "ServiceException", "ResourceNotReadyException", "ResourceConflictException",
		"EC2UnexpectedException", "ENILimitReachedException", "SubnetIPAddressLimitReachedException",
		"EFSIOException", "EFSMountConnectivityException", "EFSMountFailureException", "EFSMountTimeoutException",
		"S3FilesMountConnectivityException", "S3FilesMountFailureException", "S3FilesMountTimeoutException",
		"SnapStartException", "SnapStartNotReadyException", "SnapStartTimeoutException",
		"InvalidRuntimeException", "InvalidZipFileException", "InvalidSubnetIDException", "InvalidSecurityGroupIDException":
		// Failures of the function's environment or state: an operator or
		// Lambda itself fixes them, and the retries then drain.
		return publish.Retry(outboxtype.CodeTarget5xx, err, wait)
	case "ResourceNotFoundException":
		return publish.Fail(outboxtype.CodeTargetNotFound, err)
	case "ExpiredTokenException", "ExpiredToken", "RequestExpired":
		// Credentials that aged out (a session token past expiry, a
		// request signed too long ago): the SDK's credential cache
		// refreshes and corrects its clock skew, and a new invocation has
		// new credentials, so it is retried, as the SNS and EventBridge
		// publishers retry it.
		return publish.Retry(outboxtype.CodeAccessDenied, err, wait)
	case "AccessDeniedException", "AccessDenied", "EC2AccessDeniedException",
		"UnrecognizedClientException", "InvalidClientTokenId", "InvalidSignatureException", "SignatureDoesNotMatch",
		"IncompleteSignature", "AuthFailure", "MissingAuthenticationTokenException", "MissingAuthenticationToken",
		"NotAuthorized", "OptInRequired",
		"KMSAccessDeniedException", "KMSDisabledException", "KMSInvalidStateException", "KMSNotFoundException":
		// Credentials that are not valid, or an identity that may not
		// invoke the function, whatever status they come with.
		return publish.Fail(outboxtype.CodeAccessDenied, err)
	case "RequestTooLargeException", "SerializedRequestEntityTooLargeException":
		return publish.Fail(outboxtype.CodePayloadTooLarge, err)
	case "InvalidRequestContentException", "UnsupportedMediaTypeException":
		return publish.Fail(outboxtype.CodeInvalidPayload, err)
	}
	switch {
	case status == http.StatusTooManyRequests:
		return publish.Retry(outboxtype.CodeThrottled, err, wait)
	case status == http.StatusRequestTimeout:
		return publish.Retry(outboxtype.CodeTimeout, err, wait)
	case status >= 500 && status <= 599, status == http.StatusTooEarly:
		return publish.Retry(outboxtype.CodeTarget5xx, err, wait)
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return publish.Fail(outboxtype.CodeAccessDenied, err)
	case status == http.StatusNotFound:
		return publish.Fail(outboxtype.CodeTargetNotFound, err)
	case status == http.StatusRequestEntityTooLarge:
		return publish.Fail(outboxtype.CodePayloadTooLarge, err)
	case status >= 400 && status <= 499:
		return publish.Fail(outboxtype.CodeTargetRejected, err)
	}
	// No status, or one that is not an error: nothing says the message was
	// refused.
	return publish.Retry(outboxtype.CodeTarget5xx, err, wait)
}

// classifyFunctionError reads the runtime's {"errorType","errorMessage"}.
func (p *Publisher) classifyFunctionError(kind string, payload []byte) publish.Result {
	var body struct {
		ErrorType    json.RawMessage `json:"errorType"`
		ErrorMessage json.RawMessage `json:"errorMessage"`
	}
	_ = json.Unmarshal(payload, &body) // a payload that is not this shape leaves both empty
	errorType, _ := jsonString(body.ErrorType)
	message, ok := jsonString(body.ErrorMessage)
	if !ok && len(body.ErrorType) == 0 {
		message = string(payload) // not the runtime's shape: show what came
	}
	what := "function error (" + snippet(kind) + ")"
	if errorType != "" {
		what += " " + snippet(errorType)
	}
	err := p.errorf("%s: %s", what, snippet(message))
	if isTerminalErrorType(errorType) {
		return publish.Fail(outboxtype.CodeFunctionError, err)
	}
	return publish.Retry(outboxtype.CodeFunctionError, err, 0)
}

// isTerminalErrorType matches TerminalError bare (Go, Node, Python) or
// qualified by a package or an enclosing class (Java, .NET).
func isTerminalErrorType(t string) bool {
	return t == terminalErrorType ||
		strings.HasSuffix(t, "."+terminalErrorType) || strings.HasSuffix(t, "$"+terminalErrorType)
}

// classifyResponse reads a successful invocation's answer.
func (p *Publisher) classifyResponse(out *lambda.InvokeOutput) publish.Result {
	ref := targetRef(out)
	if !bytes.HasPrefix(bytes.TrimLeft(out.Payload, " \t\r\n"), []byte("{")) {
		return publish.Ok(ref)
	}
	var resp struct {
		Status     json.RawMessage `json:"status"`
		Error      json.RawMessage `json:"error"`
		RetryAfter json.RawMessage `json:"retry_after_seconds"`
	}
	if json.Unmarshal(out.Payload, &resp) != nil || len(resp.Status) == 0 || string(resp.Status) == "null" {
		return publish.Ok(ref)
	}
	message, _ := jsonString(resp.Error)
	if message == "" {
		message = "(no error given)"
	}
	status, ok := jsonString(resp.Status)
	switch {
	case !ok:
		return publish.Retry(outboxtype.CodeTarget5xx,
			p.errorf("the response's status is not a string (%s); the plugin contract allows ok, delivered, rejected and retry", snippet(string(resp.Status))), 0)
	case status == "" || status == StatusOK || status == StatusDelivered:
		return publish.Ok(ref)
	case status == StatusRejected:
		return publish.Fail(outboxtype.CodeTargetRejected, p.errorf("rejected: %s", snippet(message)))
	case status == StatusRetry:
		return publish.Retry(outboxtype.CodeTarget5xx, p.errorf("asked for a retry: %s", snippet(message)), secondsAfter(resp.RetryAfter))
	}
	return publish.Retry(outboxtype.CodeTarget5xx,
		p.errorf("the response's status %q is not one the plugin contract allows (ok, delivered, rejected, retry)", snippet(status)), 0)
}

// targetRef names a delivery: the request id, which the function's logs
// show; else the version that ran.
func targetRef(out *lambda.InvokeOutput) string {
	if id, ok := awsmiddleware.GetRequestIDMetadata(out.ResultMetadata); ok && id != "" {
		return id
	}
	if out.ExecutedVersion != nil && *out.ExecutedVersion != "" {
		return "version " + *out.ExecutedVersion
	}
	return "status " + strconv.Itoa(int(out.StatusCode))
}

func jsonString(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// secondsAfter reads retry_after_seconds (a number or a numeric string),
// capped like an HTTP Retry-After.
func secondsAfter(raw json.RawMessage) time.Duration {
	if len(raw) == 0 {
		return 0
	}
	text := string(raw)
	if s, ok := jsonString(raw); ok {
		text = s
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
	if err != nil || math.IsNaN(secs) || secs <= 0 {
		return 0
	}
	if secs >= backoff.MaxRetryAfter.Seconds() {
		return backoff.MaxRetryAfter
	}
	return time.Duration(secs * float64(time.Second))
}

// retryAfter reads an API error's Retry-After header (Lambda sends
// seconds).
func retryAfter(header http.Header) time.Duration {
	v := header.Get("Retry-After")
	if v == "" {
		return 0
	}
	return secondsAfter(json.RawMessage(strconv.Quote(v)))
}

// snippet reduces untrusted text to at most snippetBytes of printable,
// valid UTF-8 on one line.
func snippet(s string) string {
	const ellipsis = "…"
	var out strings.Builder
	space := false
	for _, r := range s {
		if unicode.IsSpace(r) {
			space = out.Len() > 0
			continue
		}
		if !unicode.IsPrint(r) {
			r = utf8.RuneError
		}
		need := utf8.RuneLen(r)
		if space {
			need++
		}
		if out.Len()+need > snippetBytes-len(ellipsis) {
			out.WriteString(ellipsis)
			break
		}
		if space {
			out.WriteByte(' ')
			space = false
		}
		out.WriteRune(r)
	}
	return out.String()
}

func (p *Publisher) errorf(format string, args ...any) error {
	return fmt.Errorf("lambdainvoke: invoke "+p.function+": "+format, args...)
}
