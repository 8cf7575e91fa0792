// Package ssmparam reads the SSM Parameter Store parameter a function's
// configuration names (OUTBOX_ROUTES_SSM_PARAMETER): routes larger than
// Lambda's 4 KB environment, or changed without a deployment (a new cold
// start picks them up). It is apart from package config so that only the
// processes that may read a parameter — the dispatch function and
// outboxctl — link the SSM client, and the AWS configuration is loaded only
// when a parameter is named.
package ssmparam

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/smithy-go"
)

// Timeout bounds one read of a parameter, its retries included: a cold
// start that cannot reach SSM fails within it and says so, instead of
// running out the function's init phase.
const Timeout = 10 * time.Second

// Reader returns a function that reads a parameter, decrypted (a
// SecureString's plain text), by name or ARN, for config.Env.ReadParameter.
// loadAWS loads the AWS configuration on the first read (the SDK's default
// chain, AWS_ENDPOINT_URL_SSM and AWS_ENDPOINT_URL included).
func Reader(ctx context.Context, loadAWS func(context.Context) (aws.Config, error)) func(name string) (string, error) {
	var client *ssm.Client
	return func(name string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, Timeout)
		defer cancel()
		if client == nil {
			cfg, err := loadAWS(ctx)
			if err != nil {
				return "", fmt.Errorf("load the AWS configuration: %w", err)
			}
			client = ssm.NewFromConfig(cfg)
		}
		out, err := client.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(name), WithDecryption: aws.Bool(true)})
		if err != nil {
			return "", explain(err)
		}
		if out.Parameter == nil || out.Parameter.Value == nil {
			return "", errors.New("SSM returned the parameter without a value")
		}
		return *out.Parameter.Value, nil
	}
}

// explain says what the common failures mean for the operator deploying
// the function.
func explain(err error) error {
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	switch apiErr.ErrorCode() {
	case "ParameterNotFound":
		return fmt.Errorf("no such parameter in this account and region (%s)", apiErr.ErrorCode())
	case "AccessDeniedException":
		return fmt.Errorf("access denied: the function's role needs ssm:GetParameter on the parameter, and kms:Decrypt on its key if it is a SecureString under a customer managed key (%w)", err)
	}
	return err
}
