package sns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
)

const (
	retryable = publish.Retryable
	terminal  = publish.Terminal
)

// The whole mapping, code by code and status by status.
func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f       failure
		kind    publish.Kind
		code    outboxtype.Code
		isolate bool
	}{
		// Throttling, by code or by status.
		{failure{code: "Throttling", status: 400}, retryable, outboxtype.CodeThrottled, false},
		{failure{code: "ThrottlingException", status: 400}, retryable, outboxtype.CodeThrottled, false},
		{failure{code: "ThrottledException", status: 400}, retryable, outboxtype.CodeThrottled, false},
		{failure{code: "Throttled", status: 400}, retryable, outboxtype.CodeThrottled, false},
		{failure{code: "RequestLimitExceeded", status: 400}, retryable, outboxtype.CodeThrottled, false},
		{failure{code: "TooManyRequestsException", status: 400}, retryable, outboxtype.CodeThrottled, false},
		{failure{code: "KMSThrottling", status: 400}, retryable, outboxtype.CodeThrottled, false},
		{failure{status: 429}, retryable, outboxtype.CodeThrottled, false},
		{failure{code: "Whatever", status: 429}, retryable, outboxtype.CodeThrottled, false},
		// SNS's own failures.
		{failure{code: "InternalError", status: 500}, retryable, outboxtype.CodeTarget5xx, false},
		{failure{code: "InternalFailure", status: 500}, retryable, outboxtype.CodeTarget5xx, false},
		{failure{code: "ServiceUnavailable", status: 503}, retryable, outboxtype.CodeTarget5xx, false},
		{failure{status: 500}, retryable, outboxtype.CodeTarget5xx, false},
		{failure{status: 502}, retryable, outboxtype.CodeTarget5xx, false},
		{failure{status: 504}, retryable, outboxtype.CodeTarget5xx, false},
		{failure{code: "SomethingNew", status: 503}, retryable, outboxtype.CodeTarget5xx, false},
		// Credentials that refresh.
		{failure{code: "ExpiredToken", status: 403}, retryable, outboxtype.CodeAccessDenied, false},
		{failure{code: "ExpiredTokenException", status: 400}, retryable, outboxtype.CodeAccessDenied, false},
		{failure{code: "RequestExpired", status: 400}, retryable, outboxtype.CodeAccessDenied, false},
		// Access denied for good.
		{failure{code: "AuthorizationError", status: 403}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "AccessDenied", status: 403}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "AccessDeniedException", status: 400}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "InvalidClientTokenId", status: 403}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "SignatureDoesNotMatch", status: 403}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "UnrecognizedClientException", status: 400}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "InvalidSignatureException", status: 400}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "IncompleteSignature", status: 400}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "AuthFailure", status: 401}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "MissingAuthenticationToken", status: 403}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "MissingAuthenticationTokenException", status: 403}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "NotAuthorized", status: 403}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "OptInRequired", status: 403}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "InvalidSecurity", status: 403}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "KMSAccessDenied", status: 400}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "KMSDisabled", status: 400}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "KMSInvalidState", status: 400}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "KMSNotFound", status: 400}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "KMSOptInRequired", status: 403}, terminal, outboxtype.CodeAccessDenied, false},
		// No such topic.
		{failure{code: "NotFound", status: 404}, terminal, outboxtype.CodeTargetNotFound, false},
		{failure{code: "NotFoundException", status: 404}, terminal, outboxtype.CodeTargetNotFound, false},
		// The request is invalid because of some entry in it: isolate it.
		{failure{code: "InvalidParameter", status: 400}, terminal, outboxtype.CodeInvalidPayload, true},
		{failure{code: "InvalidParameterValue", status: 400}, terminal, outboxtype.CodeInvalidPayload, true},
		{failure{code: "ParameterValueInvalid", status: 400}, terminal, outboxtype.CodeInvalidPayload, true},
		{failure{code: "ValidationException", status: 400}, terminal, outboxtype.CodeInvalidPayload, true},
		{failure{code: "BatchRequestTooLong", status: 400}, terminal, outboxtype.CodePayloadTooLarge, true},
		{failure{code: "InvalidParameter", status: 400, tooLong: true}, terminal, outboxtype.CodePayloadTooLarge, true},
		{failure{code: "InvalidParameter", side: sideSender, tooLong: true}, terminal, outboxtype.CodePayloadTooLarge, true},
		// Unknown whole-call errors are retryable.
		{failure{code: "SomethingNew", status: 400}, retryable, outboxtype.CodeTargetRejected, false},
		{failure{code: "TooManyEntriesInBatchRequest", status: 400}, retryable, outboxtype.CodeTargetRejected, false},
		{failure{status: 403}, retryable, outboxtype.CodeAccessDenied, false},
		{failure{status: 401}, retryable, outboxtype.CodeAccessDenied, false},
		{failure{code: "SomethingNew", status: 403}, retryable, outboxtype.CodeAccessDenied, false},
		{failure{status: 404}, retryable, outboxtype.CodeTargetNotFound, false},
		{failure{code: "SomethingNew", status: 404}, retryable, outboxtype.CodeTargetNotFound, false},
		{failure{status: 200}, retryable, outboxtype.CodeTarget5xx, false},
		{failure{}, retryable, outboxtype.CodeTarget5xx, false},
		// Entries: SenderFault decides what the code does not.
		{failure{code: "InternalError", side: sideReceiver}, retryable, outboxtype.CodeTarget5xx, false},
		{failure{code: "SomethingNew", side: sideReceiver}, retryable, outboxtype.CodeTarget5xx, false},
		{failure{code: "InvalidParameter", side: sideReceiver}, retryable, outboxtype.CodeTarget5xx, false},
		{failure{code: "Throttling", side: sideSender}, retryable, outboxtype.CodeThrottled, false},
		{failure{code: "InvalidParameter", side: sideSender}, terminal, outboxtype.CodeInvalidPayload, true},
		{failure{code: "KMSAccessDenied", side: sideSender}, terminal, outboxtype.CodeAccessDenied, false},
		{failure{code: "SomethingNew", side: sideSender}, terminal, outboxtype.CodeTargetRejected, false},
	} {
		name := fmt.Sprintf("%s/%d/%d", tc.f.code, tc.f.status, tc.f.side)
		v := classify(tc.f)
		if v.kind != tc.kind || v.code != tc.code || v.isolate != tc.isolate {
			t.Errorf("%s: %s %s isolate=%t, want %s %s isolate=%t", name, v.kind, v.code, v.isolate, tc.kind, tc.code, tc.isolate)
		}
	}
}

// apiError builds what the SDK returns for an error answer: an operation
// error around a response error around the API error.
func apiError(status int, code string) error { return apiErrorSaying(status, code, "m") }

func apiErrorSaying(status int, code, message string) error {
	return &smithy.OperationError{ServiceID: "SNS", OperationName: "PublishBatch", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err:      &smithy.GenericAPIError{Code: code, Message: message},
		},
		RequestID: "r",
	}}
}

func statusError(status int, err error) error {
	return &smithy.OperationError{ServiceID: "SNS", OperationName: "PublishBatch", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: err},
	}}
}

// sendError is the SDK's error for a call that got no answer: the
// transport's failure in a RequestSendError, in a response error of
// status 0.
func sendError(err error) error {
	return statusError(0, &smithyhttp.RequestSendError{Err: err})
}

// noCredentials is the SDK's error for a call it could not sign: the
// credential provider's error, wrapped by the identity step (in text only)
// and by the retryer, which tried twice.
func noCredentials(providerErr error) error {
	return &smithy.OperationError{ServiceID: "SNS", OperationName: "PublishBatch", Err: &retry.MaxAttemptsError{
		Attempt: 2, Err: fmt.Errorf("get identity: get credentials: failed to refresh cached credentials, %w", providerErr),
	}}
}

// metadataError is the instance metadata client's error for an answer of
// status: no role (404), or a token refused (403).
func metadataError(status int) error {
	return &smithy.OperationError{ServiceID: "ec2imds", OperationName: "GetMetadata", Err: &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: errors.New("request to EC2 IMDS failed"),
	}}
}

// callResult reads the facts out of the errors the SDK really returns.
func TestCallResult(t *testing.T) {
	t.Parallel()
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		parent  context.Context
		err     error
		kind    publish.Kind
		code    outboxtype.Code
		isolate bool
	}{
		{"throttled", live, apiError(400, "Throttling"), retryable, outboxtype.CodeThrottled, false},
		{"429 without a code", live, statusError(429, errors.New("garbled")), retryable, outboxtype.CodeThrottled, false},
		{"typed exception", live, statusError(403, &types.AuthorizationErrorException{Message: aws.String("no")}), terminal, outboxtype.CodeAccessDenied, false},
		{"not found", live, apiError(404, "NotFound"), terminal, outboxtype.CodeTargetNotFound, false},
		{"invalid parameter", live, apiError(400, "InvalidParameter"), terminal, outboxtype.CodeInvalidPayload, true},
		{"message too long", live, apiErrorSaying(400, "InvalidParameter", "Invalid parameter: Message too long"), terminal, outboxtype.CodePayloadTooLarge, true},
		{"too long, but not an invalid parameter", live, apiErrorSaying(403, "AuthorizationError", "Message too long"), terminal, outboxtype.CodeAccessDenied, false},
		{"500 garbled", live, statusError(500, errors.New("xml: syntax error")), retryable, outboxtype.CodeTarget5xx, false},
		{"empty error body", live, apiError(503, "UnknownError"), retryable, outboxtype.CodeTarget5xx, false},
		{"an answer wins over an ended context", ended, apiError(403, "AuthorizationError"), terminal, outboxtype.CodeAccessDenied, false},
		{"call timeout", live, sendError(fmt.Errorf("wrapped: %w", context.DeadlineExceeded)), retryable, outboxtype.CodeTimeout, false},
		{"invocation ended", ended, sendError(context.Canceled), retryable, outboxtype.CodeCanceled, false},
		{"SDK backoff cut short", live, &aws.RequestCanceledError{Err: context.DeadlineExceeded}, retryable, outboxtype.CodeTimeout, false},
		{"refused", live, sendError(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), retryable, outboxtype.CodeNetwork, false},
		{"reset", live, sendError(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), retryable, outboxtype.CodeNetwork, false},
		{"EOF", live, sendError(io.EOF), retryable, outboxtype.CodeNetwork, false},
		{"DNS", live, sendError(&net.DNSError{Err: "no such host", Name: "sns.example", IsNotFound: true}), retryable, outboxtype.CodeNetwork, false},
		{"body cut short on a 200", live, statusError(200, io.ErrUnexpectedEOF), retryable, outboxtype.CodeNetwork, false},
		{"garbled 200", live, statusError(200, &smithy.DeserializationError{Err: errors.New("bad xml")}), retryable, outboxtype.CodeTarget5xx, false},
		{"unknown", live, errors.New("something else"), retryable, outboxtype.CodeTarget5xx, false},

		// No credentials: whatever the credential source said, nothing was
		// sent, and the code is ACCESS_DENIED.
		{"instance metadata without a role", live, noCredentials(fmt.Errorf("no EC2 IMDS role found, %w", metadataError(404))), retryable, outboxtype.CodeAccessDenied, false},
		{"instance metadata refusing", live, noCredentials(fmt.Errorf("no EC2 IMDS role found, %w", metadataError(403))), retryable, outboxtype.CodeAccessDenied, false},
		{"instance metadata unreachable", live, noCredentials(&smithy.OperationError{ServiceID: "ec2imds", OperationName: "GetMetadata",
			Err: &smithyhttp.RequestSendError{Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}}), retryable, outboxtype.CodeAccessDenied, false},
		{"instance metadata timing out", live, noCredentials(&smithy.OperationError{ServiceID: "ec2imds", OperationName: "GetMetadata",
			Err: &smithyhttp.RequestSendError{Err: timeoutError{}}}), retryable, outboxtype.CodeAccessDenied, false},
		{"STS refusing the role", live, noCredentials(&smithy.OperationError{ServiceID: "STS", OperationName: "AssumeRoleWithWebIdentity",
			Err: &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 400}},
				Err: &smithy.GenericAPIError{Code: "InvalidIdentityToken"}}}}), retryable, outboxtype.CodeAccessDenied, false},
		{"container endpoint's own error", live, noCredentials(&smithy.GenericAPIError{Code: "Throttling"}), retryable, outboxtype.CodeAccessDenied, false},
		{"container endpoint unreachable", live, noCredentials(&smithyhttp.RequestSendError{Err: io.EOF}), retryable, outboxtype.CodeAccessDenied, false},
		{"empty static keys", live, noCredentials(&credentials.StaticCredentialsEmptyError{}), retryable, outboxtype.CodeAccessDenied, false},
		{"no credentials as the invocation ends", ended, noCredentials(fmt.Errorf("no EC2 IMDS role found, %w", metadataError(404))), retryable, outboxtype.CodeCanceled, false},
		// What the SDK does not wrap in a type is not a credential failure.
		{"a provider's own error", live, noCredentials(errors.New("vault unreachable")), retryable, outboxtype.CodeTarget5xx, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, isolate := callResult(tc.parent, tc.err)
			if r.Kind != tc.kind || r.Code != tc.code || isolate != tc.isolate {
				t.Errorf("%s %s isolate=%t, want %s %s isolate=%t", r.Kind, r.Code, isolate, tc.kind, tc.code, tc.isolate)
			}
			if !errors.Is(r.Err, tc.err) {
				t.Errorf("result error %v does not wrap the call's error", r.Err)
			}
		})
	}
}

func TestEntryResult(t *testing.T) {
	t.Parallel()
	r := entryResult(types.BatchResultErrorEntry{Id: aws.String("3"), Code: aws.String("KMSDisabled"), Message: aws.String("key disabled"), SenderFault: true})
	var entryErr *EntryError
	if r.Kind != terminal || r.Code != outboxtype.CodeAccessDenied || !errors.As(r.Err, &entryErr) {
		t.Fatalf("%s %s %v", r.Kind, r.Code, r.Err)
	}
	if entryErr.Code != "KMSDisabled" || entryErr.Message != "key disabled" || !entryErr.SenderFault {
		t.Errorf("entry error %+v", entryErr)
	}
	r = entryResult(types.BatchResultErrorEntry{Id: aws.String("3"), Code: aws.String("InternalError"), SenderFault: false})
	if r.Kind != retryable || r.Code != outboxtype.CodeTarget5xx {
		t.Errorf("InternalError without sender fault: %s %s", r.Kind, r.Code)
	}
	// moto's answer, word for word, to a PublishBatch entry over 256 KiB.
	r = entryResult(types.BatchResultErrorEntry{Id: aws.String("3"), Code: aws.String("InvalidParameter"), SenderFault: true,
		Message: aws.String("An error occurred (InvalidParameter) when calling the Publish operation: Invalid parameter: Message too long")})
	if r.Kind != terminal || r.Code != outboxtype.CodePayloadTooLarge {
		t.Errorf("InvalidParameter saying the message is too long: %s %s, want terminal PAYLOAD_TOO_LARGE", r.Kind, r.Code)
	}
	r = entryResult(types.BatchResultErrorEntry{Id: aws.String("3"), Code: aws.String("InvalidParameter"), SenderFault: true,
		Message: aws.String("Invalid parameter: Empty message")})
	if r.Kind != terminal || r.Code != outboxtype.CodeInvalidPayload {
		t.Errorf("InvalidParameter for an empty message: %s %s, want terminal INVALID_PAYLOAD", r.Kind, r.Code)
	}
}

// timeoutError is a net.Error that timed out, as a dial or a read does.
type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }
