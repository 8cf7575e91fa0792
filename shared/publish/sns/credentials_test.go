package sns_test

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
	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// A publisher whose client has no usable credentials — none configured, or
// a default chain that finds none — answers ACCESS_DENIED, whatever the
// credential source's own failure looked like: retryable when the SDK could
// not get credentials (nothing was sent), terminal when SNS refused an
// unsigned request (MissingAuthenticationToken, as for any other denial).
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
			fake := snsfake.New(t)
			cfg := fake.Config()
			cfg.Credentials = tc.creds(t)
			pub, err := sns.New(sns.NewClient(cfg, sns.DefaultConcurrency), sns.Config{TopicARN: snsfake.TopicARN(standardTopic)})
			if err != nil {
				t.Fatal(err)
			}
			msgs := publishtest.Messages(3, 64)
			results := pub.Publish(context.Background(), msgs)
			checkDenied(t, msgs, results, tc.kind)
			if n := len(fake.Received()); n != 0 {
				t.Errorf("the fake accepted %d messages", n)
			}
			if sent := fake.Requests() > 0; sent != tc.sent {
				t.Errorf("%d requests reached SNS, want any: %t", fake.Requests(), tc.sent)
			}
		})
	}
}

func checkDenied(t *testing.T, msgs []*outboxtype.Message, results []publish.Result, kind publish.Kind) {
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
	cfg, err := config.LoadDefaultConfig(context.Background(), config.WithRegion(snsfake.Region),
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

// Credentials SNS will not take now but may take on the next attempt.
var refreshCodes = []string{"ExpiredToken", "ExpiredTokenException", "RequestExpired"}

// Credentials that are not valid, or may not publish to the topic.
var deniedCodes = []string{
	"InvalidClientTokenId", "UnrecognizedClientException", "InvalidSignatureException", "SignatureDoesNotMatch",
	"IncompleteSignature", "AuthFailure", "MissingAuthenticationToken", "MissingAuthenticationTokenException",
	"AccessDenied", "AccessDeniedException", "NotAuthorized", "OptInRequired",
	// SNS's own: IAM or the topic policy, KMS's key policy for an
	// encrypted topic.
	"AuthorizationError", "InvalidSecurity",
	"KMSAccessDenied", "KMSDisabled", "KMSInvalidState", "KMSNotFound", "KMSOptInRequired",
}

// Every credential and access error SNS can answer is ACCESS_DENIED,
// whatever status it comes with.
func TestCredentialErrorsAreAccessDenied(t *testing.T) {
	t.Parallel()
	type answer struct {
		status int
		code   string
		kind   publish.Kind
	}
	var answers []answer
	for _, status := range []int{http.StatusBadRequest, http.StatusForbidden} {
		for _, code := range refreshCodes {
			answers = append(answers, answer{status, code, publish.Retryable})
		}
		for _, code := range deniedCodes {
			answers = append(answers, answer{status, code, publish.Terminal})
		}
	}
	// An answer without a code goes by its status.
	answers = append(answers, answer{http.StatusForbidden, "", publish.Retryable}, answer{http.StatusUnauthorized, "", publish.Retryable})
	for _, a := range answers {
		t.Run(fmt.Sprintf("%d %s", a.status, a.code), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOptions{noRetrys: true})
			b.fake.FailCalls(1, a.status, a.code)
			msgs := publishtest.Messages(3, 64)
			checkDenied(t, msgs, b.pub.Publish(context.Background(), msgs), a.kind)
		})
	}
}

// A topic that does not exist is TARGET_NOT_FOUND.
func TestMissingTopicIsTargetNotFound(t *testing.T) {
	t.Parallel()
	for _, a := range []struct {
		status int
		code   string
		kind   publish.Kind
	}{
		{http.StatusNotFound, "NotFound", publish.Terminal},
		{http.StatusBadRequest, "NotFound", publish.Terminal},
		{http.StatusNotFound, "NotFoundException", publish.Terminal},
		{http.StatusNotFound, "", publish.Retryable}, // no code: the status says
	} {
		t.Run(fmt.Sprintf("%d %s", a.status, a.code), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOptions{noRetrys: true})
			b.fake.FailCalls(1, a.status, a.code)
			msgs := publishtest.Messages(3, 64)
			for i, r := range b.pub.Publish(context.Background(), msgs) {
				if r.Kind != a.kind || r.Code != outboxtype.CodeTargetNotFound || r.Err == nil {
					t.Errorf("message %d: %s %s (%v), want %s %s", i, r.Kind, r.Code, r.Err, a.kind, outboxtype.CodeTargetNotFound)
				}
			}
		})
	}
}
