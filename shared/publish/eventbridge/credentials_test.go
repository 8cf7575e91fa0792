package eventbridge_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/eventbridge"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// Without usable credentials, ACCESS_DENIED (see publishtest.RunNoCredentials);
// EventBridge refuses an unsigned request with
// MissingAuthenticationTokenException. Not parallel: the default chain
// reads the environment, which the test empties.
func TestNoCredentialsIsAccessDenied(t *testing.T) {
	publishtest.RunNoCredentials(t, publishtest.CredentialsTarget{Service: "EventBridge", Region: eventbridgefake.Region,
		New: func(t *testing.T, creds aws.CredentialsProvider) (publish.Publisher, func() int, func() int) {
			fake := eventbridgefake.New(t)
			cfg := fake.Config()
			cfg.Credentials = creds
			pub, err := eventbridge.New(awseb.NewFromConfig(cfg), eventbridge.Config{EventBus: "orders"})
			if err != nil {
				t.Fatal(err)
			}
			return pub, fake.Requests, func() int { return len(fake.Received()) }
		}})
}

// EventBridge's own denials: the bus's resource policy, KMS's key policy
// for a bus encrypted with a customer managed key.
var ownDeniedCodes = []string{
	"NotAuthorizedForSourceException", "NotAuthorizedForDetailTypeException",
	"KMSAccessDeniedException", "KMSDisabledException", "KMSInvalidStateException", "KMSNotFoundException",
}

// Every credential and access error EventBridge can answer is
// ACCESS_DENIED, whatever status it comes with.
func TestCredentialErrorsAreAccessDenied(t *testing.T) {
	t.Parallel()
	answers := publishtest.CredentialAnswers([]int{http.StatusBadRequest, http.StatusForbidden}, ownDeniedCodes...)
	// An answer without a code goes by its status.
	answers = append(answers, publishtest.CredentialAnswer{Status: http.StatusForbidden, Kind: publish.Retryable},
		publishtest.CredentialAnswer{Status: http.StatusUnauthorized, Kind: publish.Retryable})
	for _, a := range answers {
		t.Run(a.Name(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventbridge.Config{})
			b.fake.FailCalls(1, a.Status, a.Code)
			msgs := publishtest.Messages(3, 64)
			publishtest.CheckDenied(t, msgs, b.publisher.Publish(context.Background(), msgs), a.Kind)
		})
	}
	// A refusal of one entry says the same.
	for _, code := range append(append(append([]string{}, publishtest.RefreshCodes...), publishtest.DeniedCodes...), ownDeniedCodes...) {
		t.Run("entry "+code, func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventbridge.Config{})
			msgs := publishtest.Messages(3, 64)
			b.fake.FailMessage(msgs[1].ID, code, "injected")
			r := b.publisher.Publish(context.Background(), msgs)[1]
			if r.Code != outboxtype.CodeAccessDenied || r.Err == nil {
				t.Errorf("%s %s (%v), want %s", r.Kind, r.Code, r.Err, outboxtype.CodeAccessDenied)
			}
		})
	}
}

// A bus that does not exist is TARGET_NOT_FOUND.
func TestMissingBusIsTargetNotFound(t *testing.T) {
	t.Parallel()
	for _, a := range []struct {
		status int
		code   string
		kind   publish.Kind
	}{
		{http.StatusBadRequest, "ResourceNotFoundException", publish.Terminal},
		{http.StatusNotFound, "ResourceNotFoundException", publish.Terminal},
		{http.StatusNotFound, "", publish.Retryable}, // no code: the status says
	} {
		t.Run(fmt.Sprintf("%d %s", a.status, a.code), func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventbridge.Config{})
			b.fake.FailCalls(1, a.status, a.code)
			msgs := publishtest.Messages(3, 64)
			for i, r := range b.publisher.Publish(context.Background(), msgs) {
				if r.Kind != a.kind || r.Code != outboxtype.CodeTargetNotFound || r.Err == nil {
					t.Errorf("message %d: %s %s (%v), want %s %s", i, r.Kind, r.Code, r.Err, a.kind, outboxtype.CodeTargetNotFound)
				}
			}
		})
	}
}
