package lambdainvoke

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
)

// A publisher whose client has no usable credentials — none configured, or
// a default chain that finds none — answers ACCESS_DENIED, whatever the
// credential source's own failure looked like: retryable when the SDK could
// not get credentials (nothing was sent), terminal when Lambda refused an
// unsigned request (MissingAuthenticationTokenException, as for any other
// denial).
//
// Not parallel: the default chain reads the environment, which the test
// empties.
func TestNoCredentialsIsAccessDenied(t *testing.T) {
	for _, tc := range []struct {
		name  string
		creds func(t *testing.T) aws.CredentialsProvider
		kind  publish.Kind
		sent  bool
	}{
		{"no credentials provider", func(*testing.T) aws.CredentialsProvider { return nil }, publish.Terminal, true},
		{"anonymous credentials", func(*testing.T) aws.CredentialsProvider { return aws.AnonymousCredentials{} }, publish.Terminal, true},
		{"empty static keys", func(*testing.T) aws.CredentialsProvider {
			return credentials.NewStaticCredentialsProvider("", "", "")
		}, publish.Retryable, false},
		{"default chain, instance metadata refuses connections", func(t *testing.T) aws.CredentialsProvider {
			return defaultChainWithoutCredentials(t, refusingEndpoint(t), false)
		}, publish.Retryable, false},
		{"default chain, instance metadata has no role", func(t *testing.T) aws.CredentialsProvider {
			return defaultChainWithoutCredentials(t, metadataWithoutRole(t), false)
		}, publish.Retryable, false},
		{"default chain, instance metadata never answers", func(t *testing.T) aws.CredentialsProvider {
			return defaultChainWithoutCredentials(t, silentMetadata(t), false)
		}, publish.Retryable, false},
		{"default chain, instance metadata switched off", func(t *testing.T) aws.CredentialsProvider {
			return defaultChainWithoutCredentials(t, refusingEndpoint(t), true)
		}, publish.Retryable, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := lambdafake.New(t)
			fake.Handle(testFunction, ok(""))
			cfg := fake.Config()
			cfg.Credentials = tc.creds(t)
			p, err := New(lambda.NewFromConfig(cfg), Config{Function: testFunction})
			if err != nil {
				t.Fatal(err)
			}
			r := publishOne(t, p)
			if r.Kind != tc.kind || r.Code != outboxtype.CodeAccessDenied || r.Err == nil {
				t.Errorf("%s %s (%v), want %s %s", r.Kind, r.Code, r.Err, tc.kind, outboxtype.CodeAccessDenied)
			}
			if n := len(fake.Invocations()); n != 0 {
				t.Errorf("the function ran %d times", n)
			}
			if sent := fake.Requests() > 0; sent != tc.sent {
				t.Errorf("%d requests reached Lambda, want any: %t", fake.Requests(), tc.sent)
			}
		})
	}
}

// defaultChainWithoutCredentials is the credentials provider
// config.LoadDefaultConfig resolves, as a function's main calls it, where
// there are no credentials at all: no AWS_* variables, no shared config or
// credentials file, and the chain's last resort, the instance metadata
// service, at metadataEndpoint (or switched off). The SDK's retries are off
// so that each case takes one attempt per call.
func defaultChainWithoutCredentials(t *testing.T, metadataEndpoint string, metadataOff bool) aws.CredentialsProvider {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{
		"AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SECRET_KEY", "AWS_SESSION_TOKEN",
		"AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
		"AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
		"AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "AWS_EC2_METADATA_V1_DISABLED",
	} {
		t.Setenv(name, "")
	}
	t.Setenv("HOME", dir)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	off := ""
	if metadataOff {
		off = "true"
	}
	t.Setenv("AWS_EC2_METADATA_DISABLED", off)
	cfg, err := config.LoadDefaultConfig(context.Background(), config.WithRegion(lambdafake.Region),
		config.WithEC2IMDSEndpoint(metadataEndpoint),
		config.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Credentials
}

// refusingEndpoint is an address nothing listens on, as the metadata
// service is outside EC2.
func refusingEndpoint(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// metadataWithoutRole is an instance metadata service on an instance
// without an instance profile: a session token, then 404 for the role.
func metadataWithoutRole(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Path == "/latest/api/token" {
			w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", "21600")
			w.Write([]byte("token"))
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// silentMetadata is a metadata endpoint that accepts connections and never
// answers: the SDK's metadata client gives up on its own timeout.
func silentMetadata(t *testing.T) string {
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) })
	return srv.URL
}

// Credentials Lambda will not take now but may take on the next attempt.
var refreshCodes = []string{"ExpiredToken", "ExpiredTokenException", "RequestExpired"}

// Credentials that are not valid, or may not invoke the function.
var deniedCodes = []string{
	"InvalidClientTokenId", "UnrecognizedClientException", "InvalidSignatureException", "SignatureDoesNotMatch",
	"IncompleteSignature", "AuthFailure", "MissingAuthenticationToken", "MissingAuthenticationTokenException",
	"AccessDenied", "AccessDeniedException", "NotAuthorized", "OptInRequired",
	// Lambda's own: the function's execution role may not use its
	// network interfaces or its KMS key.
	"EC2AccessDeniedException",
	"KMSAccessDeniedException", "KMSDisabledException", "KMSInvalidStateException", "KMSNotFoundException",
}

// Every credential and access error the Invoke API can answer is
// ACCESS_DENIED, whatever status it comes with.
func TestCredentialErrorsAreAccessDenied(t *testing.T) {
	t.Parallel()
	type answer struct {
		status int
		code   string
		kind   publish.Kind
	}
	var answers []answer
	for _, status := range []int{http.StatusBadRequest, http.StatusForbidden, http.StatusBadGateway} {
		for _, code := range refreshCodes {
			answers = append(answers, answer{status, code, publish.Retryable})
		}
		for _, code := range deniedCodes {
			answers = append(answers, answer{status, code, publish.Terminal})
		}
	}
	for _, a := range answers {
		t.Run(fmt.Sprintf("%d %s", a.status, a.code), func(t *testing.T) {
			t.Parallel()
			p, fake := newTestPublisher(t, ok(""), nil)
			fake.FailCalls(1, a.status, a.code)
			r := publishOne(t, p)
			if r.Kind != a.kind || r.Code != outboxtype.CodeAccessDenied || r.Err == nil {
				t.Errorf("%s %s (%v), want %s %s", r.Kind, r.Code, r.Err, a.kind, outboxtype.CodeAccessDenied)
			}
		})
	}
}

// A function that does not exist is TARGET_NOT_FOUND.
func TestMissingFunctionIsTargetNotFound(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusNotFound, http.StatusBadRequest} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			p, fake := newTestPublisher(t, ok(""), nil)
			fake.FailCalls(1, status, "ResourceNotFoundException")
			if r := publishOne(t, p); r.Kind != publish.Terminal || r.Code != outboxtype.CodeTargetNotFound || r.Err == nil {
				t.Errorf("%s %s (%v), want terminal %s", r.Kind, r.Code, r.Err, outboxtype.CodeTargetNotFound)
			}
		})
	}
	t.Run("unknown to the fake", func(t *testing.T) {
		t.Parallel()
		p, _ := newTestPublisher(t, nil, nil) // answers 404 ResourceNotFoundException
		if r := publishOne(t, p); r.Kind != publish.Terminal || r.Code != outboxtype.CodeTargetNotFound || r.Err == nil {
			t.Errorf("%s %s (%v), want terminal %s", r.Kind, r.Code, r.Err, outboxtype.CodeTargetNotFound)
		}
	})
}
