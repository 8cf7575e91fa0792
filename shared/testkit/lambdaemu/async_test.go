package lambdaemu_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
)

// quickAsync retries throttled events soon, so that tests do not wait out
// Lambda's backoff of seconds to minutes.
var quickAsync = lambdaemu.AsyncConfig{ThrottleBackoff: 20 * time.Millisecond, MaxThrottleBackoff: 200 * time.Millisecond}

func TestConcurrencyLimitHoldsUnderAnAsyncBurst(t *testing.T) {
	t.Parallel()
	const limit, burst = 3, 30
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "probe", lambdaemu.FunctionConfig{ReservedConcurrency: limit, Async: quickAsync})
	client := sdkClient(e)

	var wg sync.WaitGroup
	errs := make(chan error, burst)
	for range burst {
		wg.Go(func() {
			out, err := client.Invoke(t.Context(), &lambda.InvokeInput{
				FunctionName: aws.String("probe"), InvocationType: types.InvocationTypeEvent, Payload: []byte(`{"sleep_ms": 100}`),
			})
			if err == nil && out.StatusCode != http.StatusAccepted {
				t.Errorf("Event invoke answered %d, want 202", out.StatusCode)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, e, "probe", 50*time.Second)

	s := stats(t, e, "probe")
	invs := invocations(t, e, "probe")
	if s.MaxConcurrency > limit || maxOverlap(invs) > limit {
		t.Errorf("concurrency reached %d (records: %d), above the limit of %d", s.MaxConcurrency, maxOverlap(invs), limit)
	}
	if s.MaxEnvironments > limit || s.EnvironmentsStarted > limit {
		t.Errorf("%d environments at once, %d started, over the limit of %d", s.MaxEnvironments, s.EnvironmentsStarted, limit)
	}
	if got := s.Count(lambdaemu.Event, lambdaemu.OutcomeSucceeded); got != burst || s.AsyncAccepted != burst {
		t.Errorf("%d of %d accepted events succeeded: %+v", got, s.AsyncAccepted, s)
	}
	if s.AsyncThrottles == 0 {
		t.Error("a burst of 30 over 3 environments was never throttled")
	}
	for _, inv := range invs {
		if inv.Trigger != lambdaemu.TriggerInvokeAPI || inv.Type != lambdaemu.Event || inv.Queued.IsZero() {
			t.Errorf("record %+v: want an Event from the Invoke API with its queue time", inv)
		}
	}
}

func TestQueuedEventsWaitForCapacity(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "probe", lambdaemu.FunctionConfig{ReservedConcurrency: 1, Async: quickAsync})

	first, err := e.InvokeAsync("probe", []byte(`{"sleep_ms": 500}`))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the first event to start", func() bool { return stats(t, e, "probe").MaxConcurrency == 1 })
	second, err := e.InvokeAsync("probe", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	waitIdle(t, e, "probe", 30*time.Second)

	byID := map[string]lambdaemu.Invocation{}
	for _, inv := range invocations(t, e, "probe") {
		byID[inv.RequestID] = inv
	}
	a, b := byID[first], byID[second]
	if a.Outcome != lambdaemu.OutcomeSucceeded || b.Outcome != lambdaemu.OutcomeSucceeded {
		t.Fatalf("outcomes %s and %s, want both succeeded", a.Outcome, b.Outcome)
	}
	if b.Start.Before(a.End) || !b.Queued.Before(a.End) {
		t.Errorf("the second event (queued %s) started %s, before the first ended %s", b.Queued, b.Start, a.End)
	}
	if s := stats(t, e, "probe"); s.AsyncThrottles == 0 {
		t.Error("the second event was never throttled")
	}
}

func TestQueuedEventIsDroppedAtItsMaximumAge(t *testing.T) {
	t.Parallel()
	const maxAge = time.Second
	e := newEmulator(t, lambdaemu.Options{})
	async := quickAsync
	async.MaximumEventAge = maxAge
	register(t, e, "probe", lambdaemu.FunctionConfig{ReservedConcurrency: 1, Async: async})

	if _, err := e.InvokeAsync("probe", []byte(`{"sleep_ms": 4000}`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the first event to start", func() bool { return stats(t, e, "probe").MaxConcurrency == 1 })
	late, err := e.InvokeAsync("probe", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	waitIdle(t, e, "probe", 30*time.Second)

	dropped, err := e.DroppedEvents("probe")
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 1 || dropped[0].RequestID != late || dropped[0].Reason != lambdaemu.DropMaxEventAge || dropped[0].Attempts != 0 {
		t.Fatalf("dropped %+v, want the late event, unrun, for its age", dropped)
	}
	if age := dropped[0].Dropped.Sub(dropped[0].Queued); age < maxAge {
		t.Errorf("dropped at age %s, before its maximum age of %s", age, maxAge)
	}
	if s := stats(t, e, "probe"); s.Invocations != 1 || s.Dropped[lambdaemu.DropMaxEventAge] != 1 {
		t.Errorf("stats: %+v", s)
	}
}

func TestFailedEventIsRetriedThenDropped(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	async := quickAsync
	async.MaximumRetryAttempts, async.RetryDelay = 1, 100*time.Millisecond
	register(t, e, "probe", lambdaemu.FunctionConfig{Async: async})

	id, err := e.InvokeAsync("probe", []byte(`{"fail": "ledger locked"}`))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the event's retry to be spent", func() bool {
		return stats(t, e, "probe").Dropped[lambdaemu.DropRetriesExhausted] == 1
	})
	invs := invocations(t, e, "probe")
	if len(invs) != 2 || invs[0].RequestID != id || invs[1].RequestID != id || invs[1].Attempt != 2 || invs[1].Outcome != lambdaemu.OutcomeFunctionError {
		t.Fatalf("invocations %+v, want the event twice, failing", invs)
	}
	if gap := invs[1].Start.Sub(invs[0].End); gap < 100*time.Millisecond {
		t.Errorf("retried %s after the failure, before the retry delay of 100ms", gap)
	}
}
