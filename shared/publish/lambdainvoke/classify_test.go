package lambdainvoke

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
)

// sdkError wraps err as the SDK does for an answer with status and header.
func sdkError(status int, header http.Header, err error) error {
	return &smithy.OperationError{ServiceID: "Lambda", OperationName: "Invoke", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status, Header: header}},
			Err:      err,
		},
		RequestID: "req-1",
	}}
}

// noCredentials is the SDK's error for a call it could not sign: the
// credential provider's error, wrapped by the identity step (in text only).
func noCredentials(providerErr error) error {
	return &smithy.OperationError{ServiceID: "Lambda", OperationName: "Invoke",
		Err: fmt.Errorf("get identity: get credentials: failed to refresh cached credentials, %w", providerErr)}
}

// metadataError is the instance metadata client's error for an answer of
// status: no role (404), or a token refused (403).
func metadataError(status int) error {
	return &smithy.OperationError{ServiceID: "ec2imds", OperationName: "GetMetadata", Err: &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: errors.New("request to EC2 IMDS failed"),
	}}
}

// TestClassify drives the one classification function with the errors and
// answers the SDK produces, including those a wire fake cannot: a bare
// API error without a response, a context that ended, an answer the SDK
// could not read.
func TestClassify(t *testing.T) {
	t.Parallel()
	p := &Publisher{function: "f", timeout: 5 * time.Second}
	alive := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	str := func(s string) *string { return &s }
	cases := []struct {
		name   string
		parent context.Context
		out    *lambda.InvokeOutput
		err    error
		kind   publish.Kind
		code   outboxtype.Code
		wait   time.Duration
	}{
		{"throttled with Retry-After", alive, nil,
			sdkError(429, http.Header{"Retry-After": {"5"}}, &types.TooManyRequestsException{Message: str("Rate Exceeded.")}),
			publish.Retryable, outboxtype.CodeThrottled, 5 * time.Second},
		{"typed not found", alive, nil, sdkError(404, nil, &types.ResourceNotFoundException{}),
			publish.Terminal, outboxtype.CodeTargetNotFound, 0},
		{"bare KMS error, no response", alive, nil, &smithy.GenericAPIError{Code: "KMSNotFoundException"},
			publish.Terminal, outboxtype.CodeAccessDenied, 0},
		{"bare unknown error code, no response", alive, nil, &smithy.GenericAPIError{Code: "Mystery"},
			publish.Retryable, outboxtype.CodeTarget5xx, 0},
		{"an API error beats an ended context", ended, nil, sdkError(404, nil, &types.ResourceNotFoundException{}),
			publish.Terminal, outboxtype.CodeTargetNotFound, 0},
		{"expired token, whatever the status", alive, nil, sdkError(400, nil, &smithy.GenericAPIError{Code: "ExpiredTokenException"}),
			publish.Retryable, outboxtype.CodeAccessDenied, 0},
		{"unrecognized client, whatever the status", alive, nil, sdkError(400, nil, &smithy.GenericAPIError{Code: "UnrecognizedClientException"}),
			publish.Terminal, outboxtype.CodeAccessDenied, 0},
		{"unsigned", alive, nil, sdkError(403, nil, &smithy.GenericAPIError{Code: "MissingAuthenticationTokenException"}),
			publish.Terminal, outboxtype.CodeAccessDenied, 0},

		// No credentials: whatever the credential source said, nothing
		// was sent.
		{"instance metadata without a role", alive, nil, noCredentials(fmt.Errorf("no EC2 IMDS role found, %w", metadataError(404))),
			publish.Retryable, outboxtype.CodeAccessDenied, 0},
		{"instance metadata refusing", alive, nil, noCredentials(fmt.Errorf("no EC2 IMDS role found, %w", metadataError(403))),
			publish.Retryable, outboxtype.CodeAccessDenied, 0},
		{"STS refusing the role", alive, nil, noCredentials(&smithy.OperationError{ServiceID: "STS", OperationName: "AssumeRole",
			Err: sdkError(403, nil, &smithy.GenericAPIError{Code: "AccessDenied"})}), publish.Retryable, outboxtype.CodeAccessDenied, 0},
		{"container endpoint unreachable", alive, nil, noCredentials(&smithyhttp.RequestSendError{Err: errors.New("connection refused")}),
			publish.Retryable, outboxtype.CodeAccessDenied, 0},
		{"empty static keys", alive, nil, noCredentials(&credentials.StaticCredentialsEmptyError{}),
			publish.Retryable, outboxtype.CodeAccessDenied, 0},
		{"no credentials as the invocation ends", ended, nil, noCredentials(fmt.Errorf("no EC2 IMDS role found, %w", metadataError(404))),
			publish.Retryable, outboxtype.CodeCanceled, 0},
		{"a provider's own error", alive, nil, noCredentials(errors.New("vault unreachable")),
			publish.Retryable, outboxtype.CodeNetwork, 0},
		{"call timeout", alive, nil, fmt.Errorf("operation error Lambda: Invoke: %w", context.DeadlineExceeded),
			publish.Retryable, outboxtype.CodeTimeout, 0},
		{"caller ended", ended, nil, fmt.Errorf("operation error Lambda: Invoke: %w", context.Canceled),
			publish.Retryable, outboxtype.CodeCanceled, 0},
		{"unreadable 502", alive, nil, sdkError(502, nil, &smithy.DeserializationError{Err: errors.New("bad json")}),
			publish.Retryable, outboxtype.CodeTarget5xx, 0},
		{"unreadable 400", alive, nil, sdkError(400, nil, &smithy.DeserializationError{Err: errors.New("bad json")}),
			publish.Terminal, outboxtype.CodeTargetRejected, 0},
		{"send failed", alive, nil, sdkError(0, nil, &smithyhttp.RequestSendError{Err: errors.New("connection reset")}),
			publish.Retryable, outboxtype.CodeNetwork, 0},
		{"plain error", alive, nil, errors.New("dial tcp: no route to host"),
			publish.Retryable, outboxtype.CodeNetwork, 0},
		{"no output, no error", alive, nil, nil, publish.Retryable, outboxtype.CodeTarget5xx, 0},
		{"delivered, no request id", alive, &lambda.InvokeOutput{StatusCode: 200, ExecutedVersion: str("7")}, nil,
			publish.Delivered, "", 0},
		{"function error without payload", alive, &lambda.InvokeOutput{StatusCode: 200, FunctionError: str("Unhandled")}, nil,
			publish.Retryable, outboxtype.CodeFunctionError, 0},
	}
	for _, tc := range cases {
		r := p.classify(tc.parent, tc.out, tc.err)
		if r.Kind != tc.kind || r.Code != tc.code || r.RetryAfter != tc.wait {
			t.Errorf("%s: got %s %q retry-after %s (%v), want %s %q retry-after %s", tc.name, r.Kind, r.Code, r.RetryAfter, r.Err, tc.kind, tc.code, tc.wait)
		}
		if r.Kind == publish.Delivered && r.TargetRef != "version 7" {
			t.Errorf("%s: target ref %q", tc.name, r.TargetRef)
		}
		if r.Kind != publish.Delivered && r.Err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}
