// Package awserr answers, for the AWS publishers (sns, eventbridge,
// lambdainvoke), the questions about an aws-sdk-go-v2 error that are the
// same for every service, so that the webhook publisher and the scheduler
// do not link the SDK to ask them; and it is where their clients' retryer
// (NewRetryer), which decides which errors the SDK retries and how often,
// is made.
package awserr

import (
	"errors"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/credentials/processcreds"
	"github.com/aws/aws-sdk-go-v2/credentials/ssocreds"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// CredentialsUnavailable reports whether err, returned by an aws-sdk-go-v2
// client's operation, is the client's failure to get credentials to sign
// the request with — none configured, or a credential source (instance
// metadata, the container endpoint, STS, SSO, a profile's process) that
// failed — so that the request was never sent. The AWS publishers answer it
// ACCESS_DENIED, as they answer the service's own credential errors.
//
// The SDK has no type for this: its identity step wraps the provider's
// error in text only ("get identity: get credentials: …"); the legacy
// signer's *v4.SigningError is the one exception. So this is a structural
// check. Everything the client does once it sends the request — the
// answer, an unreadable answer, a failed connection — comes wrapped in the
// operation's *awshttp.ResponseError. What comes before it in the chain is
// a failure before sending, and it is a credential source's when it is
// another operation (the SDK's metadata, STS and SSO clients; none of the
// publishers' calls makes any other), an API error or HTTP failure outside
// the operation's response (the container credentials endpoint's client),
// or one of the providers' error types. A provider of one's own that fails
// with an error of its own type is not recognised.
func CredentialsUnavailable(err error) bool {
	var op *smithy.OperationError
	return errors.As(err, &op) && credentialSourceFailed(op.Err)
}

func credentialSourceFailed(err error) bool {
	for err != nil {
		switch err.(type) {
		case *awshttp.ResponseError:
			return false // sent: what follows is the service's answer
		case *smithy.OperationError, smithy.APIError, *smithyhttp.ResponseError, *smithyhttp.RequestSendError,
			*v4.SigningError, *credentials.StaticCredentialsEmptyError, *processcreds.ProviderError, *ssocreds.InvalidTokenError:
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if credentialSourceFailed(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}
