package sns_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// Without usable credentials, ACCESS_DENIED (see publishtest.RunNoCredentials);
// SNS refuses an unsigned request with MissingAuthenticationToken. Not
// parallel: the default chain reads the environment, which the test empties.
func TestNoCredentialsIsAccessDenied(t *testing.T) {
	publishtest.RunNoCredentials(t, publishtest.CredentialsTarget{Service: "SNS", Region: snsfake.Region,
		New: func(t *testing.T, creds aws.CredentialsProvider) (publish.Publisher, func() int, func() int) {
			fake := snsfake.New(t)
			cfg := fake.Config()
			cfg.Credentials = creds
			pub, err := sns.New(sns.NewClient(cfg, sns.DefaultConcurrency), sns.Config{TopicARN: snsfake.TopicARN(standardTopic)})
			if err != nil {
				t.Fatal(err)
			}
			return pub, fake.Requests, func() int { return len(fake.Received()) }
		}})
}

// Every credential and access error SNS can answer is ACCESS_DENIED,
// whatever status it comes with.
func TestCredentialErrorsAreAccessDenied(t *testing.T) {
	t.Parallel()
	answers := publishtest.CredentialAnswers([]int{http.StatusBadRequest, http.StatusForbidden},
		// SNS's own: IAM or the topic policy, KMS's key policy for an
		// encrypted topic.
		"AuthorizationError", "InvalidSecurity",
		"KMSAccessDenied", "KMSDisabled", "KMSInvalidState", "KMSNotFound", "KMSOptInRequired")
	// An answer without a code goes by its status.
	answers = append(answers, publishtest.CredentialAnswer{Status: http.StatusForbidden, Kind: publish.Retryable},
		publishtest.CredentialAnswer{Status: http.StatusUnauthorized, Kind: publish.Retryable})
	for _, a := range answers {
		t.Run(a.Name(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOptions{noRetrys: true})
			b.fake.FailCalls(1, a.Status, a.Code)
			msgs := publishtest.Messages(3, 64)
			publishtest.CheckDenied(t, msgs, b.pub.Publish(context.Background(), msgs), a.Kind)
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
