package lambdaemu_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
)

func TestInvokeAPIAnswersAsLambda(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "probe", lambdaemu.FunctionConfig{ReservedConcurrency: 1})
	client := sdkClient(e)
	ctx := t.Context()

	for _, name := range []string{"probe", "probe:$LATEST", lambdaemu.ARN("probe"), lambdaemu.Account + ":function:probe"} {
		out, err := client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(name), Payload: []byte(`{}`)})
		var a probeAnswer
		if err != nil || out.StatusCode != http.StatusOK || out.FunctionError != nil || json.Unmarshal(out.Payload, &a) != nil || a.PID == 0 {
			t.Errorf("invoke %s: %v %+v", name, err, out)
		}
	}

	out, err := client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("probe"), Payload: []byte(`{"fail": "unknown tenant"}`)})
	if err != nil || aws.ToString(out.FunctionError) != "Unhandled" || !strings.Contains(string(out.Payload), "unknown tenant") {
		t.Errorf("a function error: %v %+v", err, out)
	}

	for _, name := range []string{"missing", "probe:live", "arn:aws:lambda:eu-west-1:123456789012:function:probe"} {
		_, err = client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(name), Payload: []byte(`{}`)})
		var notFound *types.ResourceNotFoundException
		if !errors.As(err, &notFound) {
			t.Errorf("invoke %s: %v, want ResourceNotFoundException", name, err)
		}
	}

	// The only environment is busy: a RequestResponse call is throttled.
	if _, err := e.InvokeAsync("probe", []byte(`{"sleep_ms": 3000}`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the slow event to hold the environment", func() bool { return stats(t, e, "probe").MaxConcurrency == 1 && stats(t, e, "probe").Invocations == 5 })
	_, err = client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("probe"), Payload: []byte(`{}`)})
	var throttled *types.TooManyRequestsException
	if !errors.As(err, &throttled) || throttled.Reason != types.ThrottleReasonReservedFunctionConcurrentInvocationLimitExceeded {
		t.Errorf("invoke with no capacity: %v, want TooManyRequestsException (reserved concurrency)", err)
	}
	if s := stats(t, e, "probe"); s.SyncThrottles != 1 {
		t.Errorf("SyncThrottles = %d, want 1", s.SyncThrottles)
	}
}

// TestFunctionInvokesItselfThroughTheSDK: a function's own SDK client,
// configured only by the environment the emulator gives it, reaches the
// emulator's Invoke API, asynchronously as a fan-out would.
func TestFunctionInvokesItselfThroughTheSDK(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "fanout", lambdaemu.FunctionConfig{})

	first, a := invoke(t, e, "fanout", `{"invoke": {"function": "fanout", "type": "Event", "payload": {"print": ["second generation"]}}}`)
	if first.Outcome != lambdaemu.OutcomeSucceeded || a.Invoked == nil || a.Invoked.Error != "" || a.Invoked.StatusCode != http.StatusAccepted {
		t.Fatalf("the self-invocation: %s %s", first.Outcome, first.Response)
	}
	waitIdle(t, e, "fanout", 30*time.Second)
	invs := invocations(t, e, "fanout")
	if len(invs) != 2 {
		t.Fatalf("%d invocations, want 2", len(invs))
	}
	second := invs[0] // records are in the order invocations ended
	if second.RequestID == first.RequestID {
		second = invs[1]
	}
	if second.Type != lambdaemu.Event || second.Trigger != lambdaemu.TriggerInvokeAPI || second.Outcome != lambdaemu.OutcomeSucceeded {
		t.Errorf("the second generation: %+v, want an Event from the Invoke API", second)
	}
	// A process's output is read by its own goroutine, as CloudWatch Logs
	// receives it after the fact: the line may come in just after the
	// invocation ended.
	var logs []lambdaemu.LogLine
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if logs, err = e.Logs("fanout"); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(logs, func(l lambdaemu.LogLine) bool {
			return l.Text == "second generation" && l.RequestID == second.RequestID
		}) {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Errorf("no line \"second generation\" from request %s in %+v", second.RequestID, logs)
}
