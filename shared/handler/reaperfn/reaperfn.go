// Package reaperfn is the reaper function's handler: in bounded rounds it
// requeues messages whose lease expired (a dispatcher crashed or overran)
// and purges attempts, dedupe keys and ordering keys past their retention;
// it keeps the attempts archive's daily partitions made days ahead.
// What every function shares (event decoding, the runtime, the cold-start
// wiring) is in the parent package, handler.
package reaperfn

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
)

// Event is the reaper's event: a schedule tick, optionally with
// overrides.
type Event struct {
	BatchSize int `json:"batch_size,omitempty"`
	MaxRounds int `json:"max_rounds,omitempty"`
}

// Summary is the reaper's answer.
type Summary struct {
	Requeued       int   `json:"requeued"`
	PurgedAttempts int64 `json:"purged_attempts"`
	PurgedDedupe   int64 `json:"purged_dedupe"`
	PurgedKeys     int64 `json:"purged_keys"`
}

// Config bounds one reaper invocation.
type Config struct {
	WorkerPrefix string
	BatchSize    int
	MaxRounds    int
	Retention    lease.PurgeParams
	// SafetyMargin: no new round starts with less time left than this.
	SafetyMargin time.Duration
}

// safetyMargin is the reaper's SafetyMargin.
const safetyMargin = 3 * time.Second

// Handler repairs expired leases and purges what retention allows, in
// bounded rounds.
type Handler struct {
	Store  *lease.Store
	Config Config
	RT     *handler.Runtime
}

// ParseEvent validates a reaper event.
func ParseEvent(raw []byte) (Event, error) {
	var ev Event
	if err := handler.DecodeEvent("reaper", raw, &ev); err != nil {
		return ev, err
	}
	if ev.BatchSize < 0 || ev.BatchSize > config.MaxReaperBatchSize {
		return Event{}, &handler.EventError{Function: "reaper", Problem: fmt.Sprintf("batch_size must be between 1 and %d, got %d", config.MaxReaperBatchSize, ev.BatchSize)}
	}
	if ev.MaxRounds < 0 || ev.MaxRounds > config.MaxReaperRounds {
		return Event{}, &handler.EventError{Function: "reaper", Problem: fmt.Sprintf("max_rounds must be between 1 and %d, got %d", config.MaxReaperRounds, ev.MaxRounds)}
	}
	return ev, nil
}

// Handle runs one bounded reaper pass.
func (h *Handler) Handle(ctx context.Context, raw json.RawMessage) (sum Summary, err error) {
	log, cold := h.RT.Begin(ctx)
	ev, err := ParseEvent(raw)
	if err != nil {
		log.Error("malformed event", "error", err.Error())
		return Summary{}, err
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
	worker := handler.WorkerID(ctx, h.Config.WorkerPrefix)
	defer func() {
		m := h.RT.Metrics(ctx, cold)
		handler.Put(m, "ReaperRequeued", float64(sum.Requeued), emf.Count)
		handler.Put(m, "PurgedAttempts", float64(sum.PurgedAttempts), emf.Count)
		handler.Put(m, "PurgedDedupe", float64(sum.PurgedDedupe), emf.Count)
		handler.Put(m, "PurgedKeys", float64(sum.PurgedKeys), emf.Count)
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
			return sum, &handler.InvocationError{Function: "reaper", Err: fmt.Errorf("repair expired leases: %w", err)}
		}
		sum.Requeued += n
		if n < batch {
			break
		}
	}
	// The archive's days ahead, whatever the retention: a day made late
	// lives in the DEFAULT partition, which retention purges row by row.
	if _, err := h.Store.EnsureArchivePartitions(ctx, lease.ArchiveDaysAhead); err != nil {
		return sum, &handler.InvocationError{Function: "reaper", Err: fmt.Errorf("archive partitions: %w", err)}
	}
	if rt := h.Config.Retention; rt.AttemptsOlderThan == 0 && rt.DedupeOlderThan == 0 && rt.KeysOlderThan == 0 {
		return sum, nil
	}
	for round := 0; round < rounds && timeLeft(); round++ {
		res, err := h.Store.Purge(ctx, h.Config.Retention)
		if err != nil {
			return sum, &handler.InvocationError{Function: "reaper", Err: fmt.Errorf("purge: %w", err)}
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

// New builds the reaper handler; the function it returns closes the pool.
func New(ctx context.Context, cfg config.Reaper, deps handler.Deps) (*Handler, func(), error) {
	const function = "reaper"
	rt := handler.NewRuntime(function, cfg.Function, deps)
	c, err := handler.Connect(ctx, function, cfg.Function, deps, rt, cfg.AttemptCeiling)
	if err != nil {
		return nil, nil, err
	}
	return &Handler{Store: c.Store, RT: rt, Config: Config{
		WorkerPrefix: rt.FunctionName(),
		BatchSize:    cfg.BatchSize,
		MaxRounds:    cfg.MaxRounds,
		Retention:    cfg.Retention,
		SafetyMargin: safetyMargin,
	}}, c.Close, nil
}
