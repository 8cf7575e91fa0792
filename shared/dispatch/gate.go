package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxkit/dispatcher/shared/gate"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/route"
)

// Gater is the part of *gate.Store the engine uses: the per-target
// circuit breakers and rate limits, whose state the database keeps so
// that every concurrent invocation sees the same.
type Gater interface {
	Gate(ctx context.Context, workerID string, asks []gate.Ask) (map[string]gate.Grant, error)
	Record(ctx context.Context, workerID string, outs []gate.Outcome) (map[string]gate.State, error)
}

var _ Gater = (*gate.Store)(nil)

// SetGate gives the engine the store of its routes' circuit breakers and
// rate limits. Without one, a run refuses to start when any route has
// either: delivering past a configured limit is worse than not delivering.
func (e *Engine) SetGate(g Gater) { e.gate = g }

// targetGate is a target's breaker and rate limit, from its routes.
type targetGate struct {
	failures  int           // 0: no breaker
	coolDown  time.Duration // the breaker's
	perSecond int           // 0: no limit
}

// errHeld is the reason of a message a breaker or rate limit held back.
var errHeld = errors.New("held by the target's circuit breaker or rate limit")

// targetGates collects the routes' breakers and rate limits by target.
// Routes sharing a target must agree: the state is the target's.
func targetGates(routes []*route.Route) (map[string]targetGate, error) {
	gates := map[string]targetGate{}
	seen := map[string]string{}
	for _, r := range routes {
		var g targetGate
		if cb := r.CircuitBreaker; cb.Failures > 0 || cb.CoolDown != "" {
			d, err := time.ParseDuration(cb.CoolDown)
			if err != nil || d < time.Second || d > 24*time.Hour || cb.Failures < 1 {
				return nil, fmt.Errorf("dispatch: %s: circuit_breaker needs failures >= 1 and a cool_down from 1s to 24h, got %v and %q",
					r.Name, cb.Failures, cb.CoolDown)
			}
			g.failures, g.coolDown = int(cb.Failures), d
		}
		g.perSecond = int(r.RateLimit.PerSecond)
		key := r.Target.Key()
		if first, ok := seen[key]; ok && gates[key] != g {
			return nil, fmt.Errorf("dispatch: %s and %s share a target but not its circuit_breaker and rate_limit; give them the same",
				first, r.Name)
		}
		seen[key] = r.Name
		if g != (targetGate{}) {
			gates[key] = g
		}
	}
	return gates, nil
}

// gated is what the gate said of a batch's targets.
type gated map[string]gate.Grant

// gateBatch asks the gate, in one round trip and only when the batch has
// messages for a gated target, how many of each such target's messages
// may go now, and holds the rest: given back (Released, no attempt
// spent) and not due again before the gate says. An ordering key's later
// messages of the batch follow its first held one (they come after it in
// its target's group). When the gate cannot be asked, the gated targets'
// messages are all given back.
func (e *Engine) gateBatch(ctx context.Context, log *slog.Logger, workerID string, b *routedBatch, sum *Summary) gated {
	var asks []gate.Ask
	for _, key := range b.order {
		if g, ok := e.gates[key]; ok {
			asks = append(asks, gate.Ask{Target: key, Wanted: len(b.groups[key]), CoolDown: g.coolDown, PerSecond: g.perSecond})
		}
	}
	if len(asks) == 0 {
		return nil
	}
	grants, err := e.gate.Gate(ctx, workerID, asks)
	if err != nil {
		log.Warn("the circuit breakers and rate limits could not be read; their targets' messages are given back", "error", err.Error())
		grants = gated{}
	}
	now := e.cfg.Clock()
	order := b.order[:0:0]
	for _, key := range b.order {
		g, isGated := e.gates[key]
		if !isGated {
			order = append(order, key)
			continue
		}
		grant := grants[key]
		idx := b.groups[key]
		n := min(max(grant.Granted, 0), len(idx))
		if grant.State == gate.Open && n == 0 {
			log.Info("circuit open: messages held until the next probe", "target", key,
				"messages", len(idx), "next_probe", grant.RetryAt, "last_error", grant.LastError)
		}
		for j, i := range idx[n:] {
			at := grant.RetryAt
			if at.IsZero() {
				at = now
			}
			if g.perSecond > 0 && grant.State != gate.Open {
				// Spread over the rate, so that the held messages do not
				// all come back at once to be held again.
				at = at.Add(time.Duration(j) * time.Second / time.Duration(g.perSecond))
			}
			b.items[i].result = publish.Result{Kind: publish.Released, Err: errHeld}
			b.items[i].retryAt = at
			sum.Gated++
		}
		if n == 0 {
			delete(b.groups, key)
			continue
		}
		b.groups[key] = idx[:n]
		order = append(order, key)
	}
	b.order = order
	return grants
}

// recordBatch records what the calls to targets with a breaker did, in one
// round trip, and only when something is to be recorded: a failure, a
// breaker that was not closed, or a count of failures that a success now
// clears. When a breaker is open after it, the target's retryable failures
// of this batch are given back to wait for its probe, no attempt spent
// (the breaker holds the error): only failures while the breaker stays
// closed spend attempts, so an outage costs a message at most one.
func (e *Engine) recordBatch(ctx context.Context, log *slog.Logger, workerID string, b *routedBatch, grants gated, sum *Summary) {
	if grants == nil {
		return
	}
	var outs []gate.Outcome
	for key, grant := range grants {
		g := e.gates[key]
		idx, sent := b.groups[key]
		if g.failures == 0 || !sent {
			continue
		}
		o := gate.Outcome{Target: key, Threshold: g.failures, CoolDown: g.coolDown}
		for _, i := range idx {
			res := b.items[i].result
			switch {
			case res.Kind == publish.Delivered:
				o.Succeeded, o.Failures = true, 0
			case res.Kind == publish.Retryable && !configurationFailure[res.Code]:
				o.Failures++
				o.LastError = fmt.Sprintf("%s: %s", res.Code, errorText(res.Err))
			}
		}
		if o.Failures > 0 || grant.State != gate.Closed || (o.Succeeded && grant.Failures > 0) {
			outs = append(outs, o)
		}
	}
	if len(outs) == 0 {
		return
	}
	states, err := e.gate.Record(ctx, workerID, outs)
	if err != nil {
		log.Warn("the circuit breakers could not be updated", "error", err.Error())
		return
	}
	for _, o := range outs {
		st := states[o.Target]
		if !st.Open {
			continue
		}
		if grants[o.Target].State != gate.Open && grants[o.Target].State != gate.Probe {
			log.Warn("circuit opened", "target", o.Target, "next_probe", st.ProbeAt, "last_error", o.LastError)
		}
		probe := grants[o.Target].State == gate.Probe
		for _, i := range b.groups[o.Target] {
			it := &b.items[i]
			if it.result.Kind != publish.Retryable || configurationFailure[it.result.Code] {
				continue
			}
			it.result = publish.Result{Kind: publish.Released, Err: errHeld, Latency: it.result.Latency}
			it.retryAt = st.ProbeAt
			if probe {
				// Behind the next probe, which so tries another message: a
				// message that alone makes the target fail cannot keep
				// the breaker open; once a probe of another closes it,
				// the message spends attempts as any other.
				it.retryAt = st.ProbeAt.Add(e.gates[o.Target].coolDown)
			}
			sum.Gated++
		}
	}
}
