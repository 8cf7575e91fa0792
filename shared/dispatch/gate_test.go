package dispatch_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/gate"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/route"
)

// countingGate counts the engine's gate round trips.
type countingGate struct {
	inner          *gate.Store
	gates, records atomic.Int64
}

func (c *countingGate) Gate(ctx context.Context, w string, asks []gate.Ask) (map[string]gate.Grant, error) {
	c.gates.Add(1)
	return c.inner.Gate(ctx, w, asks)
}

func (c *countingGate) Record(ctx context.Context, w string, outs []gate.Outcome) (map[string]gate.State, error) {
	c.records.Add(1)
	return c.inner.Record(ctx, w, outs)
}

func gatedTable(t *testing.T, billingOpts string) *route.Table {
	t.Helper()
	table, err := route.Parse([]byte(strings.Replace(routesJSON, `"max_payload_bytes": 2048,`, `"max_payload_bytes": 2048, `+billingOpts+`,`, 1)), route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// A batch without messages for a gated target costs no gate round trip; a
// batch with some costs one, and a healthy breaker records nothing.
func TestGateRoundTripsOnlyForGatedTargets(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.table = gatedTable(t, `"circuit_breaker": {"failures": 3, "cool_down": "5s"}, "rate_limit": {"per_second": 100000}`)
	e := f.engine(t, dispatch.Config{BatchSize: 50})
	g := &countingGate{inner: gate.NewStore(f.db.Pool)}
	e.SetGate(g)
	ctx := context.Background()

	f.enqueue(t, 120, func(i int) outbox.Message { m := billingMsg(i); m.Namespace = "payments"; return m })
	sum, err := e.Run(ctx, dispatch.Request{WorkerID: "w"})
	if err != nil || sum.Delivered != 120 {
		t.Fatalf("%+v %v", sum, err)
	}
	if n := g.gates.Load() + g.records.Load(); n != 0 {
		t.Fatalf("%d gate round trips for batches with no gated target", n)
	}

	f.enqueue(t, 120, billingMsg)
	sum, err = e.Run(ctx, dispatch.Request{WorkerID: "w"})
	if err != nil || sum.Delivered != 120 {
		t.Fatalf("%+v %v", sum, err)
	}
	// Every batch but the last (empty) claim had billing messages.
	if n := g.gates.Load(); n < 1 || n > int64(sum.Batches) {
		t.Errorf("%d gate round trips for %d batches, want one per batch with a gated target", n, sum.Batches)
	}
	if n := g.records.Load(); n != 0 {
		t.Errorf("%d breaker records for a healthy target, want none", n)
	}
}

func TestRunRefusesGatedRoutesWithoutAGateStore(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.table = gatedTable(t, `"rate_limit": {"per_second": 10}`)
	e := f.engine(t, dispatch.Config{})
	if _, err := e.Run(context.Background(), dispatch.Request{WorkerID: "w"}); err == nil || !strings.Contains(err.Error(), "SetGate") {
		t.Fatalf("err = %v, want the missing gate store named", err)
	}
}

func TestRoutesSharingATargetMustAgreeOnItsGate(t *testing.T) {
	t.Parallel()
	table, err := route.Parse([]byte(`{"routes": [
	  {"match": {"namespace": "a", "topic": "*"}, "target": {"type": "sns", "topic_arn": "arn:aws:sns:us-east-1:123456789012:t"},
	   "rate_limit": {"per_second": 10}},
	  {"match": {"namespace": "b", "topic": "*"}, "target": {"type": "sns", "topic_arn": "arn:aws:sns:us-east-1:123456789012:t"}}]}`), route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pubs := map[string]publish.Publisher{table.Routes[0].Target.Key(): newTarget()}
	if _, err := dispatch.New(dispatch.Config{}, nil, table, pubs, nil); err == nil || !strings.Contains(err.Error(), "share a target") {
		t.Fatalf("err = %v, want the disagreement refused", err)
	}
}
