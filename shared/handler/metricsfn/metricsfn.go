// Package metricsfn is the metrics exporter function's handler: it reads
// outbox.stats() and writes the queue's depth, age, dead letters, expired
// leases and blocked keys as CloudWatch metrics (Embedded Metric Format),
// for the whole queue and its busiest namespace/topic pairs. What every
// function shares (event decoding, the runtime, the cold-start wiring) is
// in the parent package, handler.
package metricsfn

import (
	"cmp"
	"context"
	"encoding/json"
	"github.com/outboxkit/dispatcher/shared/gate"
	"slices"
	"time"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
)

// OtherTopics names the aggregate of every namespace/topic beyond the top
// N, in the snapshot and as the dimension values of its metrics.
const OtherTopics = "(other)"

// Snapshot is the metrics function's answer: the queue's state overall, for
// the busiest namespace/topic pairs, and for the rest together.
type Snapshot struct {
	GeneratedAt time.Time `json:"generated_at"`
	Totals      Totals    `json:"totals"`
	// Topics are the top N pairs by depth (pending plus dead).
	Topics []lease.TopicStats `json:"topics"`
	// Other aggregates the pairs beyond the top N (absent when none).
	Other *lease.TopicStats `json:"other,omitempty"`
	// TopicCount is the number of namespace/topic pairs with messages.
	TopicCount int `json:"topic_count"`
	// Pauses are the pauses in force: who paused what, when and why.
	Pauses []lease.Pause `json:"pauses"`
}

// Totals is the whole queue: a topic's counts summed over every topic.
type Totals = lease.Counts

// BuildSnapshot ranks the per-topic statistics and keeps the top n, so that
// the metrics' cardinality stays bounded however many topics there are.
func BuildSnapshot(stats []lease.TopicStats, n int, now time.Time) Snapshot {
	snap := Snapshot{GeneratedAt: now.UTC(), TopicCount: len(stats), Topics: []lease.TopicStats{}}
	ranked := slices.Clone(stats)
	slices.SortFunc(ranked, func(a, b lease.TopicStats) int {
		return cmp.Or(
			cmp.Compare(b.Pending+b.Dead, a.Pending+a.Dead),
			cmp.Compare(b.OldestPendingAgeSeconds, a.OldestPendingAgeSeconds),
			cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Topic, b.Topic))
	})
	for i, s := range ranked {
		snap.Totals.Add(s.Counts)
		if i < n {
			snap.Topics = append(snap.Topics, s)
			continue
		}
		if snap.Other == nil {
			snap.Other = &lease.TopicStats{Namespace: OtherTopics, Topic: OtherTopics}
		}
		addStats(snap.Other, s)
	}
	return snap
}

func addStats(into *lease.TopicStats, s lease.TopicStats) {
	into.Add(s.Counts)
	// The aggregate names no single topic's top error.
	into.TopErrorCode, into.TopErrorCount = "", 0
}

// Handler is the metrics exporter's handler.
type Handler struct {
	Store *lease.Store
	// TopN bounds the namespace/topic pairs reported one by one.
	TopN int
	RT   *handler.Runtime
	// Gate reads the open circuit breakers (nil: not reported).
	Gate gate.Querier
	// Now is injectable for tests.
	Now func() time.Time
}

// Handle reads outbox.stats(), writes the queue metrics as Embedded Metric
// Format documents and answers the snapshot.
func (h *Handler) Handle(ctx context.Context, raw json.RawMessage) (Snapshot, error) {
	log, cold := h.RT.Begin(ctx)
	var ev struct{}
	if err := handler.DecodeEvent("metrics", raw, &ev); err != nil {
		log.Error("malformed event", "error", err.Error())
		return Snapshot{}, err
	}
	stats, err := h.Store.Stats(ctx)
	if err != nil {
		log.Error("reading outbox.stats() failed", "error", err.Error())
		return Snapshot{}, &handler.InvocationError{Function: "metrics", Err: err}
	}
	pauses, err := h.Store.Pauses(ctx)
	if err != nil {
		log.Error("reading outbox.pauses() failed", "error", err.Error())
		return Snapshot{}, &handler.InvocationError{Function: "metrics", Err: err}
	}
	var breakers []gate.OpenBreaker
	if h.Gate != nil {
		if breakers, err = gate.OpenBreakers(ctx, h.Gate); err != nil {
			log.Error("reading outbox.open_breakers() failed", "error", err.Error())
			return Snapshot{}, &handler.InvocationError{Function: "metrics", Err: err}
		}
	}
	now := time.Now
	if h.Now != nil {
		now = h.Now
	}
	snap := BuildSnapshot(stats, h.TopN, now())
	snap.Pauses = pauses
	if snap.Pauses == nil {
		snap.Pauses = []lease.Pause{}
	}

	m := h.RT.Metrics(ctx, cold)
	// The whole queue, without dimensions beyond FunctionName: what the
	// alarms watch.
	t := snap.Totals
	handler.Put(m, "PendingDepth", float64(t.Pending), emf.Count)
	handler.Put(m, "DuePendingDepth", float64(t.Due), emf.Count)
	handler.Put(m, "LeasedDepth", float64(t.Leased), emf.Count)
	handler.Put(m, "ExpiredLeases", float64(t.ExpiredLeases), emf.Count)
	handler.Put(m, "OldestPendingAgeSeconds", t.OldestPendingAgeSeconds, emf.Seconds)
	handler.Put(m, "DeadLetterDepth", float64(t.Dead), emf.Count)
	handler.Put(m, "BlockedKeys", float64(t.BlockedKeys), emf.Count)
	handler.Put(m, "OldestBlockedKeyAgeSeconds", t.OldestBlockedKeyAgeSeconds, emf.Seconds)
	handler.Put(m, "RetryingMessages", float64(t.Retrying), emf.Count)
	handler.Put(m, "PausedMessages", float64(t.Paused), emf.Count)
	handler.Put(m, "Pauses", float64(len(snap.Pauses)), emf.Count)
	handler.Put(m, "TopicCount", float64(snap.TopicCount), emf.Count)
	// Open circuit breakers: in all (what the alarm watches), and 1 per
	// open target, to see which.
	handler.Put(m, "CircuitsOpen", float64(len(breakers)), emf.Count)
	for _, b := range breakers {
		handler.PutWith(m, []emf.Dimension{{Name: "Target", Value: b.Target}}, "CircuitOpen", 1, emf.Count)
	}
	rows := snap.Topics
	if snap.Other != nil {
		rows = append(slices.Clone(rows), *snap.Other)
	}
	for _, s := range rows {
		dims := []emf.Dimension{{Name: "Namespace", Value: s.Namespace}, {Name: "Topic", Value: s.Topic}}
		handler.PutWith(m, dims, "PendingDepth", float64(s.Pending), emf.Count)
		handler.PutWith(m, dims, "DuePendingDepth", float64(s.Due), emf.Count)
		handler.PutWith(m, dims, "ExpiredLeases", float64(s.ExpiredLeases), emf.Count)
		handler.PutWith(m, dims, "OldestPendingAgeSeconds", s.OldestPendingAgeSeconds, emf.Seconds)
		handler.PutWith(m, dims, "DeadLetterDepth", float64(s.Dead), emf.Count)
		handler.PutWith(m, dims, "BlockedKeys", float64(s.BlockedKeys), emf.Count)
		handler.PutWith(m, dims, "RetryingMessages", float64(s.Retrying), emf.Count)
		handler.PutWith(m, dims, "PausedMessages", float64(s.Paused), emf.Count)
	}
	h.RT.Flush(m, log)
	// Who paused what and why, where the on-call engineer reading the
	// metrics function's log finds it, before the invocation's summary.
	for _, p := range snap.Pauses {
		log.Warn("paused", "namespace", p.Namespace, "topic", p.Topic, "messages", p.Messages,
			"paused_by", p.PausedBy, "db_user", p.DBUser, "reason", p.Reason, "paused_at", p.PausedAt)
	}
	for _, b := range breakers {
		log.Warn("circuit breaker open: the target's messages are held until a probe succeeds", "target", b.Target,
			"since", b.Since, "next_probe", b.NextProbe, "last_error", b.LastError)
	}
	log.Info("queue snapshot", "pending", t.Pending, "due", t.Due, "leased", t.Leased,
		"expired_leases", t.ExpiredLeases, "oldest_pending_age_seconds", t.OldestPendingAgeSeconds,
		"dead", t.Dead, "blocked_keys", t.BlockedKeys, "oldest_blocked_key_age_seconds", t.OldestBlockedKeyAgeSeconds,
		"retrying", t.Retrying, "paused", t.Paused, "topics", snap.TopicCount)
	return snap, nil
}

// New builds the metrics exporter's handler; the function it returns closes
// the pool.
func New(ctx context.Context, cfg config.Metrics, deps handler.Deps) (*Handler, func(), error) {
	const function = "metrics"
	rt := handler.NewRuntime(function, cfg.Function, deps)
	c, err := handler.Connect(ctx, function, cfg.Function, deps, rt, 0)
	if err != nil {
		return nil, nil, err
	}
	return &Handler{Store: c.Store, TopN: cfg.TopN, RT: rt, Gate: c.Pool}, c.Close, nil
}
