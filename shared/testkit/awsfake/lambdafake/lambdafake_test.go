package lambdafake_test

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
)

// TestSpeaksTheInvokeAPI holds the fake to what the real SDK client expects
// of Lambda.
func TestSpeaksTheInvokeAPI(t *testing.T) {
	t.Parallel()
	fake := lambdafake.New(t)
	fake.Handle("echo", func(envelope []byte) (int, []byte, string) { return 0, envelope, "" })
	fake.Handle("echo:live", func([]byte) (int, []byte, string) { return 0, []byte(`"live"`), "" })
	fake.Handle("boom", func([]byte) (int, []byte, string) {
		return 0, []byte(`{"errorType":"Oops","errorMessage":"nope"}`), "Unhandled"
	})
	client := lambda.NewFromConfig(fake.Config())
	ctx := t.Context()

	out, err := client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: []byte(`{"a":1}`), LogType: types.LogTypeTail})
	if err != nil {
		t.Fatal(err)
	}
	logs, _ := base64.StdEncoding.DecodeString(aws.ToString(out.LogResult))
	if out.StatusCode != 200 || string(out.Payload) != `{"a":1}` || aws.ToString(out.ExecutedVersion) != "$LATEST" || !strings.HasPrefix(string(logs), "START RequestId:") {
		t.Errorf("echo: status %d payload %s version %q logs %q", out.StatusCode, out.Payload, aws.ToString(out.ExecutedVersion), logs)
	}

	out, err = client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), Qualifier: aws.String("live"), Payload: []byte(`{}`)})
	if err != nil || string(out.Payload) != `"live"` {
		t.Errorf("qualifier: %v %s", err, out.Payload)
	}

	out, err = client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("boom"), Payload: []byte(`{}`)})
	if err != nil || aws.ToString(out.FunctionError) != "Unhandled" {
		t.Errorf("function error: %v %+v", err, out)
	}

	out, err = client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), InvocationType: types.InvocationTypeEvent, Payload: []byte(`{}`)})
	if err != nil || out.StatusCode != http.StatusAccepted {
		t.Errorf("Event: %v %+v", err, out)
	}
	out, err = client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), InvocationType: types.InvocationTypeDryRun})
	if err != nil || out.StatusCode != http.StatusNoContent {
		t.Errorf("DryRun: %v %+v", err, out)
	}

	_, err = client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("missing"), Payload: []byte(`{}`)})
	var notFound *types.ResourceNotFoundException
	if !errors.As(err, &notFound) {
		t.Errorf("unknown function: %v, want ResourceNotFoundException", err)
	}
	_, err = client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: []byte(`not json`)})
	var invalid *types.InvalidRequestContentException
	if !errors.As(err, &invalid) {
		t.Errorf("non-JSON payload: %v, want InvalidRequestContentException", err)
	}

	fake.FailCallsWith(1, lambdafake.APIError{Status: 429, Type: "TooManyRequestsException", Message: "Rate Exceeded.", RetryAfter: "4"})
	_, err = client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: []byte(`{}`)})
	var throttled *types.TooManyRequestsException
	if !errors.As(err, &throttled) || aws.ToString(throttled.RetryAfterSeconds) != "4" || throttled.ErrorMessage() != "Rate Exceeded." {
		t.Errorf("injected throttle: %v", err)
	}
	if _, err := client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("echo"), Payload: []byte(`{}`)}); err != nil {
		t.Errorf("FailCallsWith(1) failed a second call: %v", err)
	}

	if got, want := fake.Requests(), 9; got != want {
		t.Errorf("Requests() = %d, want %d", got, want)
	}
	if got := len(fake.Invocations()); got != 5 { // echo, echo:live, boom, Event; not DryRun or the errors
		t.Errorf("%d invocations reached a function, want 5", got)
	}
}

func TestRefusesUnsignedRequests(t *testing.T) {
	t.Parallel()
	fake := lambdafake.New(t)
	fake.Handle("echo", func(envelope []byte) (int, []byte, string) { return 0, envelope, "" })
	resp, err := http.Post(fake.URL()+"/2015-03-31/functions/echo/invocations", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.HasPrefix(resp.Header.Get("X-Amzn-ErrorType"), "MissingAuthenticationTokenException") {
		t.Errorf("unsigned request: %d %s", resp.StatusCode, resp.Header.Get("X-Amzn-ErrorType"))
	}
}
