package handler

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
)

// ReaperEvent is the reaper's event: a schedule tick, optionally with
// overrides.
type ReaperEvent struct {
	BatchSize int `json:"batch_size,omitempty"`
	MaxRounds int `json:"max_rounds,omitempty"`
}

// ReaperSummary is the reaper's answer.
type ReaperSummary struct {
	Requeued       int   `json:"requeued"`
	PurgedAttempts int64 `json:"purged_attempts"`
	PurgedDedupe   int64 `json:"purged_dedupe"`
	PurgedKeys     int64 `json:"purged_keys"`
}

// ReaperConfig bounds one reaper invocation.
type ReaperConfig struct {
	WorkerPrefix string
	BatchSize    int
	MaxRounds    int
	Retention    lease.PurgeParams
	// SafetyMargin: no new round starts with less time left than this.
	SafetyMargin time.Duration
}

// reaperSafetyMargin is the reaper's SafetyMargin.
const reaperSafetyMargin = 3 * time.Second

// Reaper repairs expired leases and purges what retention allows, in
// bounded rounds.
type Reaper struct {
	Store  *lease.Store
	Config ReaperConfig
	RT     *Runtime
}

// ParseReaperEvent validates a reaper event.
func ParseReaperEvent(raw []byte) (ReaperEvent, error) {
	var ev ReaperEvent
	if err := DecodeEvent("reaper", raw, &ev); err != nil {
		return ev, err
	}
	if ev.BatchSize < 0 || ev.BatchSize > config.MaxReaperBatchSize {
		return ReaperEvent{}, &EventError{Function: "reaper", Problem: fmt.Sprintf("batch_size must be between 1 and %d, got %d", config.MaxReaperBatchSize, ev.BatchSize)}
	}
	if ev.MaxRounds < 0 || ev.MaxRounds > config.MaxReaperRounds {
		return ReaperEvent{}, &EventError{Function: "reaper", Problem: fmt.Sprintf("max_rounds must be between 1 and %d, got %d", config.MaxReaperRounds, ev.MaxRounds)}
	}
	return ev, nil
}

// Handle runs one bounded reaper pass.
func (h *Reaper) Handle(ctx context.Context, raw json.RawMessage) (sum ReaperSummary, err error) {
	log, cold := h.RT.Begin(ctx)
	ev, err := ParseReaperEvent(raw)
	if err != nil {
		log.Error("malformed event", "error", err.Error())
		return ReaperSummary{}, err
	}
	batch, rounds := h.Config.BatchSize, h.Config.MaxRounds
	if ev.BatchSize > 0 {
		batch = ev.BatchSize
	}
	if ev.MaxRounds > 0 {
		rounds = ev.MaxRounds
	}
	timeLeft := func() bool {
		deadline, ok := ctx.Deadline()
		return !ok || time.Until(deadline) > h.Config.SafetyMargin
	}
	worker := WorkerID(ctx, h.Config.WorkerPrefix)
	defer func() {
		m := h.RT.Metrics(ctx, cold)
		Put(m, "ReaperRequeued", float64(sum.Requeued), emf.Count)
		Put(m, "PurgedAttempts", float64(sum.PurgedAttempts), emf.Count)
		Put(m, "PurgedDedupe", float64(sum.PurgedDedupe), emf.Count)
		Put(m, "PurgedKeys", float64(sum.PurgedKeys), emf.Count)
		h.RT.Flush(m, log)
		attrs := []any{"worker_id", worker, "requeued", sum.Requeued,
			"purged_attempts", sum.PurgedAttempts, "purged_dedupe", sum.PurgedDedupe, "purged_keys", sum.PurgedKeys}
		if err != nil {
			log.Error("reaper failed", append(attrs, "error", err.Error())...)
			return
		}
		if sum.Requeued > 0 {
			// Expired leases mean a dispatcher died or overran its lease:
			// worth a warning an operator can search for.
			log.Warn("requeued messages whose lease expired", attrs...)
			return
		}
		log.Info("reaper finished", attrs...)
	}()
	for round := 0; round < rounds && timeLeft(); round++ {
		n, err := h.Store.RepairExpiredLeases(ctx, worker, batch)
		if err != nil {
			return sum, &InvocationError{Function: "reaper", Err: fmt.Errorf("repair expired leases: %w", err)}
		}
		sum.Requeued += n
		if n < batch {
			break
		}
	}
	if rt := h.Config.Retention; rt.AttemptsOlderThan == 0 && rt.DedupeOlderThan == 0 && rt.KeysOlderThan == 0 {
		return sum, nil
	}
	for round := 0; round < rounds && timeLeft(); round++ {
		res, err := h.Store.Purge(ctx, h.Config.Retention)
		if err != nil {
			return sum, &InvocationError{Function: "reaper", Err: fmt.Errorf("purge: %w", err)}
		}
		sum.PurgedAttempts += res.Attempts
		sum.PurgedDedupe += res.Dedupe
		sum.PurgedKeys += res.Keys
		if limit := int64(h.Config.Retention.MaxRows); res.Attempts < limit && res.Dedupe < limit && res.Keys < limit {
			break
		}
	}
	return sum, nil
}
