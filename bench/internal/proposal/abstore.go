package proposal

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/bench/internal/latency"
	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/lease"
)

// Variant is one combination of the store proposals.
type Variant struct {
	Name         string
	RawScan      bool
	LeanComplete bool
}

// Variants are the combinations measured: the product as it is first.
var Variants = []Variant{
	{Name: "as is"},
	{Name: "raw payload scan", RawScan: true},
	{Name: "lean completion", LeanComplete: true},
	{Name: "both", RawScan: true, LeanComplete: true},
}

// leanQuerier runs the product's queries with outbox.complete_batch
// replaced by LeanCompleteFunction, so that lease.Store's own Go code calls
// the proposed function.
type leanQuerier struct{ lease.Querier }

func (q leanQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return q.Querier.Query(ctx, strings.Replace(sql, "outbox.complete_batch(", LeanCompleteFunction+"(", 1), args...)
}

// StoreFor is the store of one variant on db.
func StoreFor(db lease.Querier, v Variant) dispatch.Store {
	q := db
	if v.LeanComplete {
		q = leanQuerier{db}
	}
	inner := lease.NewStore(q)
	if v.RawScan {
		return &ScanRawStore{DB: q, Inner: inner}
	}
	return inner
}

// ABStore is a dispatch.Store for one dispatcher that takes Variants in
// turn, one batch each, and times each variant's claims, completions and
// whole batch cycles (claim start to completion end) of full batches.
// LeanCompleteSQL must be installed in the database.
type ABStore struct {
	batchSize  int
	stores     []dispatch.Store
	next, cur  int
	cycleStart time.Time
	mu         sync.Mutex
	samples    []variantSamples
}

type variantSamples struct{ claims, completes, cycles []time.Duration }

// NewABStore returns an ABStore on db for batches of batchSize.
func NewABStore(db lease.Querier, batchSize int) *ABStore {
	s := &ABStore{batchSize: batchSize, samples: make([]variantSamples, len(Variants))}
	for _, v := range Variants {
		s.stores = append(s.stores, StoreFor(db, v))
	}
	return s
}

var _ dispatch.Store = (*ABStore)(nil)

func (s *ABStore) ClaimBatch(ctx context.Context, p lease.ClaimParams) ([]lease.Message, error) {
	s.cur = s.next % len(s.stores)
	start := time.Now()
	msgs, err := s.stores[s.cur].ClaimBatch(ctx, p)
	if len(msgs) > 0 {
		s.next++
	}
	if len(msgs) == s.batchSize {
		s.mu.Lock()
		s.samples[s.cur].claims = append(s.samples[s.cur].claims, time.Since(start))
		s.mu.Unlock()
		s.cycleStart = start
	} else {
		s.cycleStart = time.Time{}
	}
	return msgs, err
}

func (s *ABStore) CompleteBatch(ctx context.Context, worker string, rs []lease.Result) ([]lease.Completion, error) {
	start := time.Now()
	cs, err := s.stores[s.cur].CompleteBatch(ctx, worker, rs)
	if len(rs) == s.batchSize && !s.cycleStart.IsZero() {
		end := time.Now()
		s.mu.Lock()
		s.samples[s.cur].completes = append(s.samples[s.cur].completes, end.Sub(start))
		s.samples[s.cur].cycles = append(s.samples[s.cur].cycles, end.Sub(s.cycleStart))
		s.mu.Unlock()
	}
	return cs, err
}

// VariantResult is one variant's figures from the ABStores of a run.
type VariantResult struct {
	Variant
	Claim, Complete, Cycle latency.Summary
}

// Summarise pools the samples of stores by variant.
func Summarise(stores []*ABStore) []VariantResult {
	out := make([]VariantResult, len(Variants))
	for i, v := range Variants {
		var all variantSamples
		for _, s := range stores {
			s.mu.Lock()
			all.claims = append(all.claims, s.samples[i].claims...)
			all.completes = append(all.completes, s.samples[i].completes...)
			all.cycles = append(all.cycles, s.samples[i].cycles...)
			s.mu.Unlock()
		}
		out[i] = VariantResult{Variant: v, Claim: latency.Summarise(all.claims),
			Complete: latency.Summarise(all.completes), Cycle: latency.Summarise(all.cycles)}
	}
	return out
}
