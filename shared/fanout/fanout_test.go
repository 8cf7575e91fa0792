package fanout_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/outboxkit/dispatcher/shared/fanout"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/testkit/workload"
)

// setup is a database with backlog claimable messages and a Lambda fake
// that accepts the dispatch function's asynchronous invocations.
func setup(t *testing.T, backlog int, cfg fanout.Config) (*fanout.Starter, *lambdafake.Server) {
	t.Helper()
	db := pgtest.New(t)
	if err := workload.CommitBacklog(t.Context(), db.Pool, workload.NewLedger(), backlog); err != nil {
		t.Fatal(err)
	}
	fake := lambdafake.New(t)
	fake.Handle(cfg.Function, func([]byte) (int, []byte, string) { return 202, nil, "" })
	s, err := fanout.New(cfg, lambda.NewFromConfig(fake.Config()), lease.NewStore(db.Pool))
	if err != nil {
		t.Fatal(err)
	}
	return s, fake
}

var cfg = fanout.Config{Function: "stack-dispatch", MaxWorkers: 8, Generations: 1,
	FunctionTimeout: 75 * time.Second, SafetyMargin: 10 * time.Second, DrainWithin: 30 * time.Second}

// The fleet is sized to drain the backlog within DrainWithin at the
// measured rate, less what the deciding invocation delivers itself, and
// each worker is told why, with its generation.
func TestScaleOutSizesTheFleetByTheBacklog(t *testing.T) {
	t.Parallel()
	s, fake := setup(t, 5000, cfg)
	// 50 msgs/s over 30 s: 1,500 each. It delivers 1,500 itself; the
	// other 3,500 need three workers.
	d, err := s.ScaleOut(t.Context(), fanout.Situation{Rate: 50, Left: time.Minute, Continuous: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Backlog != 5000 || d.Wanted != 3 || d.Started != 3 || d.Throttled+d.Failed != 0 {
		t.Fatalf("decision %+v, want 3 workers for 5,000 at 1,500 each", d)
	}
	invs := fake.Invocations()
	if len(invs) != 3 {
		t.Fatalf("%d invocations", len(invs))
	}
	for _, inv := range invs {
		var ev fanout.Event
		if inv.InvocationType != "Event" || json.Unmarshal(inv.Payload, &ev) != nil ||
			ev.Source != fanout.Source || ev.Generation != 1 || ev.Reason != fanout.ReasonBacklog || ev.Backlog != 5000 || ev.Namespaces != nil {
			t.Errorf("invocation %s %s", inv.InvocationType, inv.Payload)
		}
	}
}

// The fleet never exceeds MaxWorkers, the starter included; a 429 is
// counted as throttled, another refusal as failed, neither is an error.
func TestScaleOutIsBoundedAndCountsThrottles(t *testing.T) {
	t.Parallel()
	s, fake := setup(t, 5000, cfg)
	fake.FailCalls(2, 429, "TooManyRequestsException")
	fake.FailCalls(1, 403, "AccessDeniedException")
	d, err := s.ScaleOut(t.Context(), fanout.Situation{Rate: 1, Left: time.Minute, Continuous: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Wanted != cfg.MaxWorkers-1 || d.Started != 4 || d.Throttled != 2 || d.Failed != 1 || d.FirstFailure == "" {
		t.Fatalf("decision %+v: want %d asked, 2 throttled, 1 failed", d, cfg.MaxWorkers-1)
	}
}

// Nothing is started at the generation limit, nor for a backlog the
// invocation delivers itself in time.
func TestScaleOutStartsNothingWhenNotNeeded(t *testing.T) {
	t.Parallel()
	s, fake := setup(t, 1000, cfg)
	for _, c := range []struct {
		sit  fanout.Situation
		want string
	}{
		{fanout.Situation{Generation: 1, Rate: 1, Left: time.Minute, Continuous: true}, fanout.SkippedGenerationLimit},
		{fanout.Situation{Rate: 100, Left: time.Minute, Continuous: true}, fanout.SkippedNoBacklog},
		// A rate whose largest fleet could take more than the count may
		// read (outbox.claimable_estimate refuses a limit over 1,000,000).
		{fanout.Situation{Rate: 100_000, Left: time.Minute, Continuous: true}, fanout.SkippedNoBacklog},
		{fanout.Situation{Rate: 0, Left: time.Minute, Continuous: true}, fanout.SkippedNoRate},
	} {
		d, err := s.ScaleOut(t.Context(), c.sit)
		if err != nil || d.Skipped != c.want || d.Wanted != 0 {
			t.Errorf("%+v: %+v, %v; want skipped %s", c.sit, d, err, c.want)
		}
	}
	if n := fake.Requests(); n != 0 {
		t.Errorf("%d Invoke calls", n)
	}
}
