package dispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/route"
)

// memoryStore hands out the same claimed batch a given number of times,
// then nothing, and answers every completion ok: a store that costs
// nothing, so that a benchmark measures the engine alone.
type memoryStore struct {
	batch       []outboxtype.Message
	completions []lease.Completion
	left        atomic.Int64
}

func (s *memoryStore) ClaimBatch(context.Context, lease.ClaimParams) ([]outboxtype.Message, error) {
	if s.left.Add(-1) < 0 {
		return nil, nil
	}
	return s.batch, nil
}

func (s *memoryStore) CompleteBatch(_ context.Context, _ string, results []lease.Result) ([]lease.Completion, error) {
	return s.completions[:len(results)], nil
}

// acceptAll delivers everything without a call.
type acceptAll struct{ results []publish.Result }

func (a acceptAll) Publish(_ context.Context, msgs []*outboxtype.Message) []publish.Result {
	return a.results[:len(msgs)]
}

// BenchmarkEngineRun measures the engine's own work per message — route,
// hand to the publisher, turn the result into an outcome, count it — over
// runs of 4 batches of 500 against a store and a target that cost nothing.
// Its allocations per run are the figure to hold: the database round trips
// and the publishers' calls are measured elsewhere.
func BenchmarkEngineRun(b *testing.B) {
	const batchSize, batches = 500, 4
	table, err := route.Parse([]byte(`{"routes": [{"match": {"namespace": "billing", "topic": "*"},
	  "target": {"type": "http", "url": "http://localhost:9/usage", "signing_secret_env": "SECRET"}}]}`), route.Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, keys := range []int{0, 50} {
		b.Run(fmt.Sprintf("ordered_keys=%d", keys), func(b *testing.B) {
			store := &memoryStore{batch: make([]outboxtype.Message, batchSize), completions: make([]lease.Completion, batchSize)}
			expires := time.Now().Add(time.Hour)
			for i := range store.batch {
				m := &store.batch[i]
				m.ID, m.LeaseToken, m.LeaseExpiresAt = uuid.New(), uuid.New(), expires
				m.Namespace, m.Topic, m.Attempt = "billing", "usage", 1
				m.Payload = json.RawMessage(`{"tenant_id":"tenant-42","tokens_in":1200}`)
				if keys > 0 {
					m.OrderingKey, m.SequenceID = fmt.Sprintf("key-%d", i%keys), int64(i/keys+1)
				}
				store.completions[i] = lease.Completion{ID: m.ID, Status: outboxtype.StatusOK}
			}
			pubs := map[string]publish.Publisher{
				table.Routes[0].Target.Key(): acceptAll{results: publish.Fill(batchSize, publish.Ok(""))},
			}
			e, err := dispatch.New(dispatch.Config{BatchSize: batchSize, MaxBatches: 100}, store, table, pubs, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				store.left.Store(batches)
				sum, err := e.Run(context.Background(), dispatch.Request{WorkerID: "bench"})
				if err != nil || sum.Delivered != batchSize*batches {
					b.Fatalf("%+v %v", sum, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batchSize*batches), "ns/msg")
		})
	}
}
