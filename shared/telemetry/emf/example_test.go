package emf_test

import (
	"os"
	"time"

	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
)

// The metrics exporter: queue depth per namespace and topic, also rolled up
// under FunctionName alone so that one alarm watches the whole queue.
func ExampleLogger() {
	m, err := emf.New("Outbox", emf.Dimension{Name: "FunctionName", Value: "outbox-metrics"})
	if err != nil {
		panic(err)
	}
	m.SetTimestamp(time.UnixMilli(1767225600000))
	_ = m.RollUp([]string{"FunctionName"})
	_ = m.SetProperty("request_id", "c6af9ac6-7b61-11e6-9a41-93e812345678")
	_ = m.PutWith([]emf.Dimension{{Name: "Namespace", Value: "billing"}, {Name: "Topic", Value: "usage"}},
		"PendingDepth", 42, emf.Count)
	_ = m.Flush(os.Stdout)
	// Output:
	// {"FunctionName":"outbox-metrics","Namespace":"billing","PendingDepth":42,"Topic":"usage","_aws":{"Timestamp":1767225600000,"CloudWatchMetrics":[{"Namespace":"Outbox","Dimensions":[["FunctionName","Namespace","Topic"],["FunctionName"]],"Metrics":[{"Name":"PendingDepth","Unit":"Count"}]}]},"level":"INFO","request_id":"c6af9ac6-7b61-11e6-9a41-93e812345678","timestamp":"2026-01-01T00:00:00.000Z"}
}
