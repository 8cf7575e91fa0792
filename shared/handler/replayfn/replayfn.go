// Package replayfn is the dead-letter replay function's handler: it moves
// dead letters matching an operator's filter back to the queue (a dry run
// unless the event says otherwise, with a reason, audited). What every
// function shares (event decoding, the runtime, the cold-start wiring) is
// in the parent package, handler.
package replayfn

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
)

// Event selects dead letters to move back to pending. The filters
// combine with AND. An empty filter is refused unless All is true; DryRun
// defaults to true; a real replay needs a Reason, which is audited.
type Event struct {
	MessageIDs   []string   `json:"message_ids,omitempty"`
	Namespace    string     `json:"namespace,omitempty"`
	Topic        string     `json:"topic,omitempty"`
	ErrorCode    string     `json:"error_code,omitempty"`
	FailedAfter  *time.Time `json:"failed_after,omitempty"`
	FailedBefore *time.Time `json:"failed_before,omitempty"`
	Limit        int        `json:"limit,omitempty"`
	DryRun       *bool      `json:"dry_run,omitempty"`
	Reason       string     `json:"reason,omitempty"`
	Operator     string     `json:"operator,omitempty"`
	All          bool       `json:"all,omitempty"`
}

// Summary is the replay function's answer.
type Summary struct {
	Matched    int      `json:"matched"`
	Replayed   int      `json:"replayed"`
	DryRun     bool     `json:"dry_run"`
	MessageIDs []string `json:"message_ids"`
}

// DefaultLimit is the limit of an event that sets none.
const DefaultLimit = 100

// ParseEvent validates a replay event into a store request. maxLimit
// caps the event's limit.
func ParseEvent(raw []byte, maxLimit int) (lease.ReplayRequest, error) {
	var ev Event
	if err := handler.DecodeEvent("dlq-replay", raw, &ev); err != nil {
		return lease.ReplayRequest{}, err
	}
	fail := func(format string, args ...any) (lease.ReplayRequest, error) {
		return lease.ReplayRequest{}, &handler.EventError{Function: "dlq-replay", Problem: fmt.Sprintf(format, args...)}
	}
	req := lease.ReplayRequest{
		Namespace: ev.Namespace, Topic: ev.Topic, ErrorCode: ev.ErrorCode,
		Limit: ev.Limit, DryRun: true, Operator: ev.Operator, Reason: ev.Reason,
	}
	for i, s := range ev.MessageIDs {
		id, err := uuid.Parse(s)
		if err != nil {
			return fail("message_ids[%d]: %q is not a message id (a UUID)", i, s)
		}
		req.MessageIDs = append(req.MessageIDs, id)
	}
	if ev.Namespace != "" && !outbox.NamePattern.MatchString(ev.Namespace) {
		return fail("namespace: %q is not a namespace", ev.Namespace)
	}
	if ev.Topic != "" && !outbox.NamePattern.MatchString(ev.Topic) {
		return fail("topic: %q is not a topic", ev.Topic)
	}
	if ev.FailedAfter != nil {
		req.FailedAfter = *ev.FailedAfter
	}
	if ev.FailedBefore != nil {
		req.FailedBefore = *ev.FailedBefore
	}
	if ev.FailedAfter != nil && ev.FailedBefore != nil && !ev.FailedAfter.Before(*ev.FailedBefore) {
		return fail("failed_after (%s) must be before failed_before (%s)", ev.FailedAfter.Format(time.RFC3339), ev.FailedBefore.Format(time.RFC3339))
	}
	switch {
	case ev.Limit == 0:
		req.Limit = min(DefaultLimit, maxLimit)
	case ev.Limit < 0 || ev.Limit > maxLimit:
		return fail("limit must be between 1 and %d, got %d", maxLimit, ev.Limit)
	}
	if ev.DryRun != nil {
		req.DryRun = *ev.DryRun
	}
	empty := len(req.MessageIDs) == 0 && req.Namespace == "" && req.Topic == "" && req.ErrorCode == "" &&
		ev.FailedAfter == nil && ev.FailedBefore == nil
	if empty && !ev.All {
		return fail(`no filter given: set message_ids, namespace, topic, error_code, failed_after or failed_before, or "all": true to select every dead letter`)
	}
	if !req.DryRun && ev.Reason == "" {
		return fail(`a replay that moves messages ("dry_run": false) needs a reason, recorded on each REPLAYED attempt`)
	}
	return req, nil
}

// Handler is the dead-letter replay function's handler.
type Handler struct {
	Store        *lease.Store
	MaxLimit     int
	WorkerPrefix string
	RT           *handler.Runtime
}

// Handle lists (dry run) or moves the matching dead letters.
func (h *Handler) Handle(ctx context.Context, raw json.RawMessage) (Summary, error) {
	log, cold := h.RT.Begin(ctx)
	req, err := ParseEvent(raw, h.MaxLimit)
	if err != nil {
		log.Error("malformed event", "error", err.Error())
		return Summary{}, err
	}
	if req.Operator == "" {
		req.Operator = handler.WorkerID(ctx, h.WorkerPrefix)
	}
	dry := req
	dry.DryRun = true
	matched, err := h.Store.ReplayDead(ctx, dry)
	if err != nil {
		return Summary{}, &handler.InvocationError{Function: "dlq-replay", Err: err}
	}
	sum := Summary{Matched: len(matched), DryRun: req.DryRun, MessageIDs: ids(matched)}
	if !req.DryRun && len(matched) > 0 {
		moved, err := h.Store.ReplayDead(ctx, req)
		if err != nil {
			return Summary{}, &handler.InvocationError{Function: "dlq-replay", Err: err}
		}
		sum.Replayed, sum.MessageIDs = len(moved), ids(moved)
	}
	m := h.RT.Metrics(ctx, cold)
	handler.Put(m, "ReplayMatched", float64(sum.Matched), emf.Count)
	handler.Put(m, "Replayed", float64(sum.Replayed), emf.Count)
	h.RT.Flush(m, log)
	log.Info("dlq-replay finished", "matched", sum.Matched, "replayed", sum.Replayed,
		"dry_run", sum.DryRun, "operator", req.Operator, "reason", req.Reason, "message_ids", sum.MessageIDs)
	return sum, nil
}

func ids(in []uuid.UUID) []string {
	out := make([]string, len(in))
	for i, id := range in {
		out[i] = id.String()
	}
	return out
}

// New builds the dead-letter replay handler; the function it returns closes
// the pool.
func New(ctx context.Context, cfg config.Replay, deps handler.Deps) (*Handler, func(), error) {
	const function = "dlq-replay"
	rt := handler.NewRuntime(function, cfg.Function, deps)
	c, err := handler.Connect(ctx, function, cfg.Function, deps, rt, 0)
	if err != nil {
		return nil, nil, err
	}
	return &Handler{Store: c.Store, MaxLimit: cfg.MaxLimit, WorkerPrefix: rt.FunctionName(), RT: rt}, c.Close, nil
}
