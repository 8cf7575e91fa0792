// Package dispatchfn is the dispatch function's handler and its cold-start
// wiring: the route table, one publisher per target, the engine. It is apart
// from package handler so that the reaper, replay and metrics functions do
// not link the publishers and their SDK clients.
package dispatchfn

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/outboxkit/dispatcher/shared/gate"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/fanout"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/publish/publishers"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
)

// Event is the dispatch function's event: optional overrides of its
// configuration, e.g. {"batch_size":500,"namespaces":["mini-chat"],"max_batches":10},
// or a fan-out worker's start (package fanout), e.g.
// {"source":"outbox.fanout","generation":1,"reason":"backlog","backlog":240000}.
type Event struct {
	BatchSize  int      `json:"batch_size,omitempty"`
	MaxBatches int      `json:"max_batches,omitempty"`
	Namespaces []string `json:"namespaces,omitempty"`

	// Source is fanout.Source for an invocation started by fan-out;
	// Generation its generation (1 for the workers a scheduled invocation
	// starts); Reason why it was started (fanout.ReasonBacklog); Backlog
	// the claimable messages its starter counted.
	Source     string `json:"source,omitempty"`
	Generation int    `json:"generation,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Backlog    int    `json:"backlog,omitempty"`
}

// Worker reports whether the event started a fan-out worker.
func (ev Event) Worker() bool { return ev.Source == fanout.Source }

// ParseEvent validates a dispatch event.
func ParseEvent(raw []byte) (Event, error) {
	var ev Event
	if err := handler.DecodeEvent("dispatch", raw, &ev); err != nil {
		return ev, err
	}
	fail := func(format string, args ...any) (Event, error) {
		return Event{}, &handler.EventError{Function: "dispatch", Problem: fmt.Sprintf(format, args...)}
	}
	if ev.BatchSize < 0 || ev.BatchSize > config.MaxBatchSize {
		return fail("batch_size must be between 1 and %d, got %d", config.MaxBatchSize, ev.BatchSize)
	}
	if ev.MaxBatches < 0 || ev.MaxBatches > config.MaxMaxBatches {
		return fail("max_batches must be between 1 and %d, got %d", config.MaxMaxBatches, ev.MaxBatches)
	}
	for _, ns := range ev.Namespaces {
		if !outbox.NamePattern.MatchString(ns) {
			return fail("namespaces: %q is not a namespace", ns)
		}
	}
	switch {
	case ev.Source != "" && ev.Source != fanout.Source:
		return fail("source must be %q or absent, got %q", fanout.Source, ev.Source)
	case ev.Source == "" && (ev.Generation != 0 || ev.Reason != "" || ev.Backlog != 0):
		return fail("generation, reason and backlog belong to a fan-out event (source %q)", fanout.Source)
	case ev.Worker() && (ev.Generation < 1 || ev.Generation > config.MaxFanoutGenerations):
		return fail("generation must be between 1 and %d, got %d", config.MaxFanoutGenerations, ev.Generation)
	case ev.Worker() && ev.Reason != fanout.ReasonBacklog:
		return fail("reason must be %q, got %q", fanout.ReasonBacklog, ev.Reason)
	case ev.Backlog < 0:
		return fail("backlog must not be negative, got %d", ev.Backlog)
	}
	return ev, nil
}

// Handler is the dispatch function's handler.
type Handler struct {
	Engine *dispatch.Engine
	RT     *handler.Runtime
	// WorkerPrefix starts every worker id (the function name); the
	// invocation's request id completes it.
	WorkerPrefix string
	// Elastic is how an invocation lingers and fans out (zero: it does
	// neither).
	Elastic Elastic
	// Namespaces are what an invocation whose event names none claims
	// (OUTBOX_NAMESPACES; nil: all).
	Namespaces []string
}

// Handle runs one dispatch invocation (one bounded run, or with linger and
// fan-out as many as its time allows), logs one summary line and writes
// the invocation's metrics.
func (h *Handler) Handle(ctx context.Context, raw json.RawMessage) (Answer, error) {
	log, cold := h.RT.Begin(ctx)
	ev, err := ParseEvent(raw)
	if err != nil {
		log.Error("malformed event", "error", err.Error())
		return Answer{}, err
	}
	// The event's namespaces, or the function's own: the fan-out counts
	// the backlog of the namespaces this function claims, not another
	// stack's on the same database.
	namespaces := ev.Namespaces
	if len(namespaces) == 0 {
		namespaces = h.Namespaces
	}
	answer, err := h.invocation(ctx, log, ev, dispatch.Request{
		WorkerID: handler.WorkerID(ctx, h.WorkerPrefix), BatchSize: ev.BatchSize,
		MaxBatches: ev.MaxBatches, Namespaces: namespaces, Log: log,
	})
	summary := answer.Summary
	m := h.RT.Metrics(ctx, cold)
	handler.Put(m, "Claimed", float64(summary.Claimed), emf.Count)
	handler.Put(m, "Delivered", float64(summary.Delivered), emf.Count)
	handler.Put(m, "Retried", float64(summary.Retried), emf.Count)
	handler.Put(m, "DeadLettered", float64(summary.Dead), emf.Count)
	handler.Put(m, "LeaseLost", float64(summary.LeaseLost), emf.Count)
	handler.Put(m, "Released", float64(summary.Released), emf.Count)
	handler.Put(m, "Held", float64(summary.Held), emf.Count)
	handler.Put(m, "Batches", float64(summary.Batches), emf.Count)
	handler.Put(m, "RunDuration", float64(summary.DurationMS), emf.Milliseconds)
	putElastic(m, answer)
	for kind, ts := range summary.Targets {
		dims := []emf.Dimension{{Name: "TargetType", Value: kind}}
		handler.PutWith(m, dims, "Delivered", float64(ts.Delivered), emf.Count)
		handler.PutWith(m, dims, "Retried", float64(ts.Retried), emf.Count)
		handler.PutWith(m, dims, "DeadLettered", float64(ts.Dead), emf.Count)
		for _, l := range ts.Latencies {
			handler.PutWith(m, dims, "DispatchLatency", handler.Milliseconds(l), emf.Milliseconds)
		}
	}
	h.RT.Flush(m, log)
	attrs := []any{
		"worker_id", summary.WorkerID, "batches", summary.Batches, "claimed", summary.Claimed,
		"delivered", summary.Delivered, "retried", summary.Retried, "dead", summary.Dead,
		"lease_lost", summary.LeaseLost, "released", summary.Released, "held", summary.Held, "duration_ms", summary.DurationMS, "stopped_by", summary.StoppedBy,
		"generation", answer.Generation, "runs", answer.Runs, "lingered_ms", answer.LingeredMS,
		"notify_wakeups", answer.NotifyWakeups, "polls", answer.Polls,
	}
	if f := answer.FanOut; f != nil {
		attrs = append(attrs, "fanout_backlog", f.Backlog, "fanout_wanted", f.Wanted, "fanout_started", f.Started,
			"fanout_throttled", f.Throttled, "fanout_failed", f.Failed, "fanout_skipped", f.Skipped)
		if f.FirstFailure != "" {
			log.Warn("fan-out: an Invoke of a worker failed", "error", f.FirstFailure, "failed", f.Failed)
		}
	}
	if err != nil {
		log.Error("dispatch failed", append(attrs, "error", err.Error())...)
		return answer, &handler.InvocationError{Function: "dispatch", Err: err}
	}
	log.Info("dispatch finished", attrs...)
	return answer, nil
}

// New builds the dispatch handler from its configuration: the pool, one
// publisher per target, the engine. The returned function closes the pool.
func New(ctx context.Context, cfg dispatchconfig.Dispatch, deps handler.Deps) (*Handler, func(), error) {
	const function = "dispatch"
	rt := handler.NewRuntime(function, cfg.Function, deps)
	c, err := handler.Connect(ctx, function, cfg.Function, deps, rt, cfg.AttemptCeiling)
	if err != nil {
		return nil, nil, err
	}
	pubs, err := publishers.Build(ctx, cfg.Routes, publishers.Deps{
		AWS: c.AWS, SigningSecret: func(name string) string { return cfg.SigningSecrets[name] }, WrapHTTP: rt.Tracer.HTTPClient,
	})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	engine, err := dispatch.New(cfg.Engine, c.Store, cfg.Routes, pubs, rt.Log)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	engine.SetTracer(rt.Tracer)
	engine.SetGate(gate.NewStore(c.Pool))
	h := &Handler{Engine: engine, RT: rt, WorkerPrefix: rt.FunctionName(), Namespaces: cfg.Engine.Namespaces}
	closeAll := c.Close
	if h.Elastic, closeAll, err = newElastic(ctx, cfg, deps, c); err != nil {
		c.Close()
		return nil, nil, err
	}
	return h, closeAll, nil
}
