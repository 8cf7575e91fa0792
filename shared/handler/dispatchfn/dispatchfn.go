// Package dispatchfn is the dispatch function's handler and its cold-start
// wiring: the route table, one publisher per target, the engine. It is apart
// from package handler so that the reaper, replay and metrics functions do
// not link the publishers and their SDK clients.
package dispatchfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/settings"
	"github.com/outboxkit/dispatcher/shared/target"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
)

// Event is the dispatch function's event: optional overrides of its
// configuration, e.g. {"batch_size":500,"namespaces":["mini-chat"],"max_batches":10}.
type Event struct {
	BatchSize  int      `json:"batch_size,omitempty"`
	MaxBatches int      `json:"max_batches,omitempty"`
	Namespaces []string `json:"namespaces,omitempty"`
}

// ParseEvent validates a dispatch event.
func ParseEvent(raw []byte) (Event, error) {
	var ev Event
	if err := handler.DecodeEvent("dispatch", raw, &ev); err != nil {
		return ev, err
	}
	fail := func(format string, args ...any) (Event, error) {
		return Event{}, &handler.EventError{Function: "dispatch", Problem: fmt.Sprintf(format, args...)}
	}
	if ev.BatchSize < 0 || ev.BatchSize > dispatch.MaxBatchSize {
		return fail("batch_size must be between 1 and %d, got %d", dispatch.MaxBatchSize, ev.BatchSize)
	}
	if ev.MaxBatches < 0 || ev.MaxBatches > 1000 {
		return fail("max_batches must be between 1 and 1000, got %d", ev.MaxBatches)
	}
	for _, ns := range ev.Namespaces {
		if !outbox.NamePattern.MatchString(ns) {
			return fail("namespaces: %q is not a namespace", ns)
		}
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
}

// Handle runs one bounded dispatch, logs one summary line and writes the
// invocation's metrics.
func (h *Handler) Handle(ctx context.Context, raw json.RawMessage) (dispatch.Summary, error) {
	log, cold := h.RT.Begin(ctx)
	ev, err := ParseEvent(raw)
	if err != nil {
		log.Error("malformed event", "error", err.Error())
		return dispatch.Summary{}, err
	}
	summary, err := h.Engine.Run(ctx, dispatch.Request{
		WorkerID: handler.WorkerID(ctx, h.WorkerPrefix), BatchSize: ev.BatchSize,
		MaxBatches: ev.MaxBatches, Namespaces: ev.Namespaces, Log: log,
	})
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
	}
	if err != nil {
		log.Error("dispatch failed", append(attrs, "error", err.Error())...)
		return summary, &handler.InvocationError{Function: "dispatch", Err: err}
	}
	log.Info("dispatch finished", attrs...)
	return summary, nil
}

// Settings is the dispatch function's configuration from the environment.
type Settings struct {
	Engine dispatch.Config
	// AttemptCeiling bounds the attempts of every message: the store's
	// and every route's max_attempts.
	AttemptCeiling int
}

// LoadSettings reads and validates the dispatch variables; every problem is
// reported at once, naming its variable.
func LoadSettings(getenv func(string) string) (Settings, error) {
	r := settings.NewReader(getenv)
	s := Settings{
		Engine: dispatch.Config{
			BatchSize:         r.Int("OUTBOX_BATCH_SIZE", 1, dispatch.MaxBatchSize),
			MaxBatches:        r.Int("OUTBOX_MAX_BATCHES", 1, 1000),
			Namespaces:        r.List("OUTBOX_NAMESPACES"),
			FunctionTimeout:   r.Duration("OUTBOX_FUNCTION_TIMEOUT", time.Second, 15*time.Minute),
			SafetyMargin:      r.Duration("OUTBOX_SAFETY_MARGIN", time.Second, 10*time.Minute),
			TargetConcurrency: r.Int("OUTBOX_TARGET_CONCURRENCY", 1, 256),
			OrderedRun:        r.Int("OUTBOX_ORDERED_RUN", 1, dispatch.MaxBatchSize),
			BatchBytes:        int64(r.Int("OUTBOX_BATCH_MAX_BYTES", 1<<20, 1<<40)),
		},
		AttemptCeiling: handler.AttemptCeiling(r),
	}
	for _, ns := range s.Engine.Namespaces {
		if !outbox.NamePattern.MatchString(ns) {
			r.Fail("OUTBOX_NAMESPACES", "contains %q, which is not a namespace", ns)
		}
	}
	if r.IsSet("OUTBOX_LEASE") {
		s.Engine.Lease = r.Duration("OUTBOX_LEASE", time.Second, 24*time.Hour)
	} else if s.Engine.FunctionTimeout > 0 {
		s.Engine.Lease = s.Engine.FunctionTimeout + s.Engine.SafetyMargin + time.Minute
	}
	if err := r.Err(); err != nil {
		return s, err
	}
	// The engine's own checks, the lease against the timeout above all.
	return s, s.Engine.Validate()
}

// New builds the dispatch handler from the environment: every
// configuration problem (routes, database, engine limits) is reported
// together, before any connection is made. The returned function closes the
// pool.
func New(ctx context.Context, env handler.Env) (*Handler, func(), error) {
	const function = "dispatch"
	dbCfg, rt, problems := handler.LoadCommon(function, env)
	s, err := LoadSettings(env.Getenv)
	if err != nil {
		problems = append(problems, err)
	}
	// The routes are checked against the ceiling the store will apply.
	routes, err := route.FromEnv(env.Getenv, env.ReadFile, route.Options{AttemptCeiling: s.AttemptCeiling})
	if err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return nil, nil, errors.Join(problems...)
	}
	c, err := handler.Connect(ctx, function, env, dbCfg, rt, s.AttemptCeiling)
	if err != nil {
		return nil, nil, err
	}
	pubs, err := target.Build(ctx, routes, target.Deps{
		AWS: c.AWS, Getenv: env.Getenv, WrapHTTP: rt.Tracer.HTTPClient,
	})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	engine, err := dispatch.New(s.Engine, c.Store, routes, pubs, rt.Log)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	engine.SetTracer(rt.Tracer)
	return &Handler{Engine: engine, RT: rt, WorkerPrefix: rt.FunctionName()}, c.Close, nil
}
