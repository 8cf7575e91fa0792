package eventbridge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
)

// operation wraps err the way the SDK hands it back from PutEvents.
func operation(err error) error {
	return &smithy.OperationError{ServiceID: "EventBridge", OperationName: "PutEvents", Err: err}
}

// answered is the SDK's error for an HTTP answer with status whose body
// the protocol decoded into apiErr (nil: a body it could not decode). The
// SDK wraps whatever happens once a request is sent — a failed connection
// (status 0) too — in the operation's response error.
func answered(status int, apiErr error) error { return operation(response(status, apiErr)) }

func response(status int, apiErr error) error {
	if apiErr == nil {
		apiErr = &smithy.DeserializationError{Err: errors.New("unexpected end of JSON input")}
	}
	return &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err:      apiErr,
		},
		RequestID: "req-1",
	}
}

// noCredentials is the SDK's error for a call it could not sign: the
// credential provider's error, wrapped by the identity step (in text only)
// and by the retryer.
func noCredentials(providerErr error) error {
	return operation(&retry.MaxAttemptsError{
		Attempt: 1, Err: fmt.Errorf("get identity: get credentials: failed to refresh cached credentials, %w", providerErr),
	})
}

// metadataError is the instance metadata client's error for an answer of
// status: no role (404), or a token refused (403).
func metadataError(status int) error {
	return &smithy.OperationError{ServiceID: "ec2imds", OperationName: "GetMetadata", Err: &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: errors.New("request to EC2 IMDS failed"),
	}}
}

func generic(code string) error { return &smithy.GenericAPIError{Code: code, Message: "m"} }

func TestClassifyCall(t *testing.T) {
	t.Parallel()
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()

	cases := []struct {
		name   string
		parent context.Context
		err    error
		kind   publish.Kind
		code   outboxtype.Code
	}{
		// Modelled and common AWS error codes decide first.
		{"ThrottlingException", live, answered(400, &types.ThrottlingException{}), publish.Retryable, outboxtype.CodeThrottled},
		{"LimitExceededException", live, answered(400, &types.LimitExceededException{}), publish.Retryable, outboxtype.CodeThrottled},
		{"throttling after the SDK's last attempt", live, operation(&retry.MaxAttemptsError{Attempt: 3, Err: response(400, generic("ThrottlingException"))}), publish.Retryable, outboxtype.CodeThrottled},
		{"InternalException", live, answered(500, &types.InternalException{}), publish.Retryable, outboxtype.CodeTarget5xx},
		{"InternalFailure", live, answered(500, generic("InternalFailure")), publish.Retryable, outboxtype.CodeTarget5xx},
		{"ServiceUnavailable", live, answered(503, generic("ServiceUnavailable")), publish.Retryable, outboxtype.CodeTarget5xx},
		{"AccessDeniedException", live, answered(400, &types.AccessDeniedException{}), publish.Terminal, outboxtype.CodeAccessDenied},
		{"UnrecognizedClientException", live, answered(400, generic("UnrecognizedClientException")), publish.Terminal, outboxtype.CodeAccessDenied},
		{"AuthFailure", live, answered(401, generic("AuthFailure")), publish.Terminal, outboxtype.CodeAccessDenied},
		{"MissingAuthenticationTokenException", live, answered(403, generic("MissingAuthenticationTokenException")), publish.Terminal, outboxtype.CodeAccessDenied},
		{"InvalidSignatureException", live, answered(403, generic("InvalidSignatureException")), publish.Terminal, outboxtype.CodeAccessDenied},
		{"ExpiredTokenException", live, answered(400, generic("ExpiredTokenException")), publish.Retryable, outboxtype.CodeAccessDenied},
		{"ResourceNotFoundException", live, answered(400, &types.ResourceNotFoundException{}), publish.Terminal, outboxtype.CodeTargetNotFound},
		{"ValidationException", live, answered(400, generic("ValidationException")), publish.Terminal, outboxtype.CodeInvalidPayload},
		{"SerializationException", live, answered(400, generic("SerializationException")), publish.Terminal, outboxtype.CodeInvalidPayload},
		// A definite answer stands even when the invocation ended meanwhile.
		{"access denied as the invocation ends", ended, answered(400, &types.AccessDeniedException{}), publish.Terminal, outboxtype.CodeAccessDenied},

		// Then the context.
		{"the call's timeout", live, operation(&smithy.CanceledError{Err: context.DeadlineExceeded}), publish.Retryable, outboxtype.CodeTimeout},
		{"the call's timeout reading the answer", live, answered(0, &smithyhttp.RequestSendError{Err: fmt.Errorf("read: %w", context.DeadlineExceeded)}), publish.Retryable, outboxtype.CodeTimeout},
		{"the invocation's end", ended, operation(&smithy.CanceledError{Err: context.Canceled}), publish.Retryable, outboxtype.CodeCanceled},
		{"the invocation's end during SDK back-off", ended, operation(&aws.RequestCanceledError{Err: context.Canceled}), publish.Retryable, outboxtype.CodeCanceled},

		// Then the HTTP status, for codes the table does not know.
		{"429 without a code", live, answered(429, generic("UnknownError")), publish.Retryable, outboxtype.CodeThrottled},
		{"502 with an HTML body", live, answered(502, nil), publish.Retryable, outboxtype.CodeTarget5xx},
		{"500 with an unknown code", live, answered(500, generic("SomethingBroke")), publish.Retryable, outboxtype.CodeTarget5xx},
		{"413", live, answered(413, nil), publish.Terminal, outboxtype.CodePayloadTooLarge},
		{"403 with an unknown code", live, answered(403, generic("Forbidden")), publish.Retryable, outboxtype.CodeAccessDenied},
		{"401", live, answered(401, nil), publish.Retryable, outboxtype.CodeAccessDenied},
		{"404", live, answered(404, nil), publish.Retryable, outboxtype.CodeTargetNotFound},
		{"400 with an unknown code", live, answered(400, generic("BrandNewException")), publish.Retryable, outboxtype.CodeTargetRejected},
		{"200 with an unreadable body", live, answered(200, nil), publish.Retryable, outboxtype.CodeTarget5xx},

		// No credentials, first: whatever the credential source said,
		// nothing was sent.
		{"legacy signer without credentials", live, operation(&v4.SigningError{Err: errors.New("failed to retrieve credentials")}), publish.Retryable, outboxtype.CodeAccessDenied},
		{"instance metadata without a role", live, noCredentials(fmt.Errorf("no EC2 IMDS role found, %w", metadataError(404))), publish.Retryable, outboxtype.CodeAccessDenied},
		{"instance metadata refusing", live, noCredentials(fmt.Errorf("no EC2 IMDS role found, %w", metadataError(403))), publish.Retryable, outboxtype.CodeAccessDenied},
		{"instance metadata unreachable", live, noCredentials(&smithy.OperationError{ServiceID: "ec2imds", OperationName: "GetMetadata",
			Err: &smithyhttp.RequestSendError{Err: syscall.ECONNREFUSED}}), publish.Retryable, outboxtype.CodeAccessDenied},
		{"STS refusing the role", live, noCredentials(&smithy.OperationError{ServiceID: "STS", OperationName: "AssumeRole",
			Err: response(403, generic("AccessDenied"))}), publish.Retryable, outboxtype.CodeAccessDenied},
		{"container endpoint's own error", live, noCredentials(generic("ResourceNotFoundException")), publish.Retryable, outboxtype.CodeAccessDenied},
		{"container endpoint unreachable", live, noCredentials(&smithyhttp.RequestSendError{Err: syscall.ECONNREFUSED}), publish.Retryable, outboxtype.CodeAccessDenied},
		{"empty static keys", live, noCredentials(&credentials.StaticCredentialsEmptyError{}), publish.Retryable, outboxtype.CodeAccessDenied},
		{"no credentials as the invocation ends", ended, noCredentials(fmt.Errorf("no EC2 IMDS role found, %w", metadataError(404))), publish.Retryable, outboxtype.CodeCanceled},
		{"a provider's own error", live, noCredentials(errors.New("vault unreachable")), publish.Retryable, outboxtype.CodeNetwork},

		// Then errors with no answer at all.
		{"input refused by the SDK", live, operation(smithy.InvalidParamsError{Context: "PutEventsInput"}), publish.Terminal, outboxtype.CodeInvalidPayload},
		{"request not serialisable", live, operation(&smithy.SerializationError{Err: errors.New("x")}), publish.Terminal, outboxtype.CodeInvalidPayload},
		{"connection refused", live, answered(0, &smithyhttp.RequestSendError{Err: syscall.ECONNREFUSED}), publish.Retryable, outboxtype.CodeNetwork},
		{"connection reset", live, answered(0, &smithyhttp.RequestSendError{Err: syscall.ECONNRESET}), publish.Retryable, outboxtype.CodeNetwork},
		{"unknown", live, errors.New("something nobody expected"), publish.Retryable, outboxtype.CodeNetwork},
	}
	for _, c := range cases {
		r := classifyCall(c.parent, c.err)
		if r.Kind != c.kind || r.Code != c.code {
			t.Errorf("%s: %s %s, want %s %s", c.name, r.Kind, r.Code, c.kind, c.code)
		}
		if !errors.Is(r.Err, c.err) {
			t.Errorf("%s: the result's error %v does not wrap the call's", c.name, r.Err)
		}
	}
}

func TestClassifyEntry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		code string
		kind publish.Kind
		want outboxtype.Code
	}{
		// EventBridge's documented retryable per-entry codes.
		{"InternalFailure", publish.Retryable, outboxtype.CodeTarget5xx},
		{"ThrottlingException", publish.Retryable, outboxtype.CodeThrottled},
		// Its documented non-retryable ones.
		{"AccessDeniedException", publish.Terminal, outboxtype.CodeAccessDenied},
		{"InvalidAccountIdException", publish.Terminal, outboxtype.CodeTargetNotFound},
		{"InvalidArgument", publish.Terminal, outboxtype.CodeInvalidPayload},
		{"MalformedDetail", publish.Terminal, outboxtype.CodeInvalidPayload},
		{"RedactionFailure", publish.Terminal, outboxtype.CodeTargetRejected},
		{"NotAuthorizedForSourceException", publish.Terminal, outboxtype.CodeAccessDenied},
		{"NotAuthorizedForDetailTypeException", publish.Terminal, outboxtype.CodeAccessDenied},
		{"UnrecognizedClientException", publish.Terminal, outboxtype.CodeAccessDenied},
		{"AuthFailure", publish.Terminal, outboxtype.CodeAccessDenied},
		{"ExpiredTokenException", publish.Retryable, outboxtype.CodeAccessDenied},
		// KMS on an encrypted bus, and the bus itself.
		{"KMSAccessDeniedException", publish.Terminal, outboxtype.CodeAccessDenied},
		{"KMSDisabledException", publish.Terminal, outboxtype.CodeAccessDenied},
		{"KMSThrottlingException", publish.Retryable, outboxtype.CodeThrottled},
		{"ResourceNotFoundException", publish.Terminal, outboxtype.CodeTargetNotFound},
		// Anything else is terminal, as EventBridge documents.
		{"SomeFutureCode", publish.Terminal, outboxtype.CodeTargetRejected},
	}
	for _, c := range cases {
		r := classifyEntry(c.code, "the message")
		var entryErr *EntryError
		if r.Kind != c.kind || r.Code != c.want || !errors.As(r.Err, &entryErr) || entryErr.ErrorCode != c.code || entryErr.ErrorMessage != "the message" {
			t.Errorf("%s: %s %s %v, want %s %s with EventBridge's code and message", c.code, r.Kind, r.Code, r.Err, c.kind, c.want)
		}
	}
}

func TestEntryResult(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		entry types.PutEventsResultEntry
		kind  publish.Kind
		code  outboxtype.Code
		ref   string
	}{
		{"an EventId", types.PutEventsResultEntry{EventId: aws.String("e-1")}, publish.Delivered, "", "e-1"},
		{"an ErrorCode", types.PutEventsResultEntry{ErrorCode: aws.String("MalformedDetail")}, publish.Terminal, outboxtype.CodeInvalidPayload, ""},
		// A refusal must never be recorded as a delivery, even beside an id.
		{"both", types.PutEventsResultEntry{EventId: aws.String("e-1"), ErrorCode: aws.String("InternalFailure")}, publish.Retryable, outboxtype.CodeTarget5xx, ""},
		{"neither", types.PutEventsResultEntry{}, publish.Retryable, outboxtype.CodeTarget5xx, ""},
		{"empty strings", types.PutEventsResultEntry{EventId: aws.String(""), ErrorCode: aws.String("")}, publish.Retryable, outboxtype.CodeTarget5xx, ""},
	}
	for _, c := range cases {
		r := entryResult(c.entry)
		if r.Kind != c.kind || r.Code != c.code || r.TargetRef != c.ref || (c.kind != publish.Delivered) != (r.Err != nil) {
			t.Errorf("%s: %s %s %q %v, want %s %s %q", c.name, r.Kind, r.Code, r.TargetRef, r.Err, c.kind, c.code, c.ref)
		}
	}
}
