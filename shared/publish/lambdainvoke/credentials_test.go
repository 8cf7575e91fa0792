package lambdainvoke

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// Without usable credentials, ACCESS_DENIED (see publishtest.RunNoCredentials);
// Lambda refuses an unsigned request with
// MissingAuthenticationTokenException. Not parallel: the default chain
// reads the environment, which the test empties.
func TestNoCredentialsIsAccessDenied(t *testing.T) {
	publishtest.RunNoCredentials(t, publishtest.CredentialsTarget{Service: "Lambda", Region: lambdafake.Region,
		New: func(t *testing.T, creds aws.CredentialsProvider) (publish.Publisher, func() int, func() int) {
			fake := lambdafake.New(t)
			fake.Handle(testFunction, ok(""))
			cfg := fake.Config()
			cfg.Credentials = creds
			p, err := New(lambda.NewFromConfig(cfg), Config{Function: testFunction})
			if err != nil {
				t.Fatal(err)
			}
			return p, fake.Requests, func() int { return len(fake.Invocations()) }
		}})
}

// Every credential and access error the Invoke API can answer is
// ACCESS_DENIED, whatever status it comes with.
func TestCredentialErrorsAreAccessDenied(t *testing.T) {
	t.Parallel()
	answers := publishtest.CredentialAnswers([]int{http.StatusBadRequest, http.StatusForbidden, http.StatusBadGateway},
		// Lambda's own: the function's execution role may not use its
		// network interfaces or its KMS key.
		"EC2AccessDeniedException",
		"KMSAccessDeniedException", "KMSDisabledException", "KMSInvalidStateException", "KMSNotFoundException")
	for _, a := range answers {
		t.Run(a.Name(), func(t *testing.T) {
			t.Parallel()
			p, fake := newTestPublisher(t, ok(""), nil)
			fake.FailCalls(1, a.Status, a.Code)
			r := publishOne(t, p)
			if r.Kind != a.Kind || r.Code != outboxtype.CodeAccessDenied || r.Err == nil {
				t.Errorf("%s %s (%v), want %s %s", r.Kind, r.Code, r.Err, a.Kind, outboxtype.CodeAccessDenied)
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
