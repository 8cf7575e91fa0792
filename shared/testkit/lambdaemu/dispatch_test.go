package lambdaemu_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// TestDispatchDeliversToAnEmulatedLambdaTarget runs the real dispatch
// bootstrap under the emulator with a route to a Lambda target that is
// another emulated function: the product's own SDK client, configured by
// nothing but the environment the emulator gives it, invokes through the
// emulator's Invoke API.
func TestDispatchDeliversToAnEmulatedLambdaTarget(t *testing.T) {
	t.Parallel()
	const messages = 5
	db := pgtest.New(t)
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "audit-sink", lambdaemu.FunctionConfig{})
	routes := fmt.Sprintf(`{"routes":[{"match":{"namespace":"billing","topic":"*"},"target":{"type":"lambda","function":%q}}]}`, lambdaemu.ARN("audit-sink"))
	if err := e.Register(lambdaemu.FunctionConfig{
		Name: "dispatch", Binary: lambdatest.Build(t, "dispatch"), Timeout: 60 * time.Second, MemoryMB: 256,
		Env: []string{"OUTBOX_DATABASE_URL=" + db.URL, "OUTBOX_TRACING=off", "OUTBOX_FUNCTION_TIMEOUT=60s", "OUTBOX_ROUTES=" + routes},
	}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range messages {
		out, err := outbox.Enqueue(t.Context(), db.Pool, outbox.Message{
			Namespace: "billing", Topic: "invoice_paid", Payload: json.RawMessage(fmt.Sprintf(`{"invoice":%d}`, i)),
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, out.ID.String())
	}

	inv, err := e.Invoke("dispatch", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var summary struct {
		Delivered int `json:"delivered"`
	}
	if inv.Outcome != lambdaemu.OutcomeSucceeded || json.Unmarshal(inv.Response, &summary) != nil || summary.Delivered != messages {
		logs, _ := e.Logs("dispatch")
		t.Fatalf("dispatch: %s %s\n%+v", inv.Outcome, inv.Response, logs)
	}
	delivered := map[string]bool{}
	for _, sinkInv := range invocations(t, e, "audit-sink") {
		var envelope struct {
			ID string `json:"id"`
		}
		if sinkInv.Type != lambdaemu.RequestResponse || sinkInv.Trigger != lambdaemu.TriggerInvokeAPI || json.Unmarshal(sinkInv.Payload, &envelope) != nil {
			t.Errorf("audit-sink invocation %+v: want a RequestResponse through the Invoke API with an envelope", sinkInv)
		}
		delivered[envelope.ID] = true
	}
	for _, id := range ids {
		if !delivered[id] {
			t.Errorf("message %s never reached audit-sink (it got %v)", id, delivered)
		}
	}
}
