package publishers_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/publishers"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// BenchmarkEventBridgeAsBuilt is an EventBridge route's publisher as the
// dispatch function builds it (publishers.Build: its SDK client, retryer
// and HTTP client) publishing 1,000 messages of 512 bytes a Publish to the
// wire-level fake answering at once: what a message costs the function in
// the SDK, net/http and the publisher. The fake runs in the same process:
// its own work is in every figure, the same before and after a change to
// the client. cpu-ns/msg is the process's CPU time, which the machine's
// other work does not inflate as it does ns/msg.
//
//	go test -run '^$' -bench EventBridgeAsBuilt -benchmem ./shared/publish/publishers
func BenchmarkEventBridgeAsBuilt(b *testing.B) {
	fake := eventbridgefake.New(b)
	table, err := route.Parse([]byte(`{"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"eventbridge","event_bus":"default"}}]}`), route.Options{})
	if err != nil {
		b.Fatal(err)
	}
	pubs, err := publishers.Build(context.Background(), table, publishers.Deps{AWS: fake.Config()})
	if err != nil {
		b.Fatal(err)
	}
	p := pubs[table.Routes[0].Target.Key()]
	msgs := publishtest.Messages(1_000, 512)
	b.ReportAllocs()
	cpuBefore := processCPU(b)
	for b.Loop() {
		for i, r := range p.Publish(context.Background(), msgs) {
			if r.Kind != publish.Delivered {
				b.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/msg")
	b.ReportMetric(float64((processCPU(b)-cpuBefore).Nanoseconds())/float64(b.N*len(msgs)), "cpu-ns/msg")
}

// processCPU is the CPU time the process has used, user and system: unlike
// the elapsed time, it does not grow with the machine's other work.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
