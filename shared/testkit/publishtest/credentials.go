package publishtest

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

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
)

// CredentialsTarget is an AWS publisher under the credentials tests: each
// AWS publisher must answer ACCESS_DENIED however its credentials fail.
type CredentialsTarget struct {
	Service string // the service's name in failures, such as "SNS"
	Region  string // the fake's region
	// New builds a publisher on a new fake whose client signs with creds
	// (nil: no provider), and returns it with the number of requests that
	// reached the fake and of messages it accepted (or invocations it ran).
	New func(t *testing.T, creds aws.CredentialsProvider) (pub publish.Publisher, requests, accepted func() int)
}

// RunNoCredentials checks that a publisher whose client has no usable
// credentials — none configured, or a default chain that finds none —
// answers ACCESS_DENIED, whatever the credential source's own failure
// looked like: retryable when the SDK could not get credentials (nothing
// was sent), terminal when the service refused an unsigned request (as for
// any other denial).
//
// Not parallel: the default chain reads the environment, which it empties.
func RunNoCredentials(t *testing.T, c CredentialsTarget) {
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
			return defaultChainWithoutCredentials(t, c.Region, refusingEndpoint(t), false)
		}, publish.Retryable, false},
		{"default chain, instance metadata has no role", func(t *testing.T) aws.CredentialsProvider {
			return defaultChainWithoutCredentials(t, c.Region, metadataWithoutRole(t), false)
		}, publish.Retryable, false},
		{"default chain, instance metadata never answers", func(t *testing.T) aws.CredentialsProvider {
			return defaultChainWithoutCredentials(t, c.Region, silentMetadata(t), false)
		}, publish.Retryable, false},
		{"default chain, instance metadata switched off", func(t *testing.T) aws.CredentialsProvider {
			return defaultChainWithoutCredentials(t, c.Region, refusingEndpoint(t), true)
		}, publish.Retryable, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub, requests, accepted := c.New(t, tc.creds(t))
			msgs := Messages(3, 64)
			CheckDenied(t, msgs, pub.Publish(context.Background(), msgs), tc.kind)
			if n := accepted(); n != 0 {
				t.Errorf("the fake accepted %d messages", n)
			}
			if sent := requests() > 0; sent != tc.sent {
				t.Errorf("%d requests reached %s, want any: %t", requests(), c.Service, tc.sent)
			}
		})
	}
}

// CheckDenied checks that every message's result is ACCESS_DENIED of kind.
func CheckDenied(t *testing.T, msgs []*outboxtype.Message, results []publish.Result, kind publish.Kind) {
	t.Helper()
	if len(results) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(results), len(msgs))
	}
	for i, r := range results {
		if r.Kind != kind || r.Code != outboxtype.CodeAccessDenied || r.Err == nil {
			t.Errorf("message %d: %s %s (%v), want %s %s", i, r.Kind, r.Code, r.Err, kind, outboxtype.CodeAccessDenied)
		}
	}
}

// RefreshCodes are credentials an AWS service will not take now but may
// take on the next attempt.
var RefreshCodes = []string{"ExpiredToken", "ExpiredTokenException", "RequestExpired"}

// DeniedCodes are the credentials every AWS service refuses as not valid
// or not allowed; each service adds its own.
var DeniedCodes = []string{
	"InvalidClientTokenId", "UnrecognizedClientException", "InvalidSignatureException", "SignatureDoesNotMatch",
	"IncompleteSignature", "AuthFailure", "MissingAuthenticationToken", "MissingAuthenticationTokenException",
	"AccessDenied", "AccessDeniedException", "NotAuthorized", "OptInRequired",
}

// CredentialAnswer is an error answer a credentials test injects, and the
// kind of ACCESS_DENIED it must give.
type CredentialAnswer struct {
	Status int
	Code   string
	Kind   publish.Kind
}

// Name names the answer's subtest.
func (a CredentialAnswer) Name() string { return fmt.Sprintf("%d %s", a.Status, a.Code) }

// CredentialAnswers is every credential and access error code, the common
// ones and the service's own (denied), with each status: the refresh codes
// retryable, the others terminal.
func CredentialAnswers(statuses []int, denied ...string) []CredentialAnswer {
	var answers []CredentialAnswer
	for _, status := range statuses {
		for _, code := range RefreshCodes {
			answers = append(answers, CredentialAnswer{status, code, publish.Retryable})
		}
		for _, code := range append(append([]string{}, DeniedCodes...), denied...) {
			answers = append(answers, CredentialAnswer{status, code, publish.Terminal})
		}
	}
	return answers
}

// defaultChainWithoutCredentials is the credentials provider
// config.LoadDefaultConfig resolves, as a function's main calls it, where
// there are no credentials at all: no AWS_* variables, no shared config or
// credentials file, and the chain's last resort, the instance metadata
// service, at metadataEndpoint (or switched off). The SDK's retries are off
// so that each case takes one attempt per call.
func defaultChainWithoutCredentials(t *testing.T, region, metadataEndpoint string, metadataOff bool) aws.CredentialsProvider {
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
	cfg, err := config.LoadDefaultConfig(context.Background(), config.WithRegion(region),
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
