package eventbridge_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/eventbridge"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// BenchmarkPublishLittlesLaw measures throughput against Little's law: with
// every PutEvents call taking a fixed latency, Publish can deliver at most
// 10 entries × Concurrency calls per latency. It publishes 10,000 messages
// of about 512 bytes, in Publish calls of 1,000, through a real SDK client
// to the wire-level fake answering each call after 20 ms, and reports
// msgs/s, the bound, the ceiling of the batch shape and their ratio
// (publishtest.BenchLittlesLaw).
//
//	go test -run '^$' -bench LittlesLaw -benchtime 3x ./shared/publish/eventbridge
func BenchmarkPublishLittlesLaw(b *testing.B) {
	shape := publishtest.LittlesLaw{
		Messages: 10_000, PerPublish: 1_000, PayloadBytes: 512,
		Latency: 20 * time.Millisecond, Concurrency: 8, PerCall: eventbridge.MaxEntriesPerCall,
	}
	fake := eventbridgefake.New(b)
	fake.SetLatency(shape.Latency)
	p, err := eventbridge.New(awseb.NewFromConfig(fake.Config()), eventbridge.Config{EventBus: "bench", Concurrency: shape.Concurrency})
	if err != nil {
		b.Fatal(err)
	}
	publishtest.BenchLittlesLaw(b, p, shape)
}

// instantBus answers every PutEvents at once, each entry accepted: no
// network, no SDK. It exists only to measure what the publisher itself
// costs per message (entry building, packing, fan-out, result mapping);
// every behaviour is tested through the real SDK client instead.
type instantBus struct{ ids []string }

func (b instantBus) PutEvents(_ context.Context, in *awseb.PutEventsInput, _ ...func(*awseb.Options)) (*awseb.PutEventsOutput, error) {
	out := &awseb.PutEventsOutput{Entries: make([]ebtypes.PutEventsResultEntry, len(in.Entries))}
	for i := range out.Entries {
		out.Entries[i].EventId = &b.ids[i]
	}
	return out, nil
}

// BenchmarkPublishOverhead is the publisher's own cost per message, in
// Publish calls of 1,000 messages of 512 bytes, with a target that answers
// instantly.
func BenchmarkPublishOverhead(b *testing.B) {
	bus := instantBus{ids: make([]string, eventbridge.MaxEntriesPerCall)}
	for i := range bus.ids {
		bus.ids[i] = fmt.Sprintf("event-%d", i)
	}
	p, err := eventbridge.New(bus, eventbridge.Config{EventBus: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	msgs := publishtest.Messages(1_000, 512)
	b.ReportAllocs()
	for b.Loop() {
		for i, r := range p.Publish(context.Background(), msgs) {
			if r.Kind != publish.Delivered {
				b.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/msg")
}
