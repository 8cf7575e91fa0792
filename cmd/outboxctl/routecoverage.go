package main

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/lease"
)

// unrouted is one namespace/topic with pending messages that no route
// matches.
type unrouted struct {
	namespace, topic string
	pending          int64
}

// warnUnroutedPending prints, before invoke dispatch runs, a warning for
// each namespace/topic with pending messages that the configured routes do
// not cover: a routes file written for one namespace, tried against a
// shared database, would otherwise send every other message through
// NO_ROUTE. Those are not dead-lettered (NO_ROUTE is a configuration
// failure, held with a capped backoff until a route covers them), but each
// claim charges them an attempt and pushes them back.
//
// It is advice: a configuration or database that fails here fails the
// cold start next, which reports it, so its own errors are dropped.
func warnUnroutedPending(ctx context.Context, w io.Writer, g *globalOptions) {
	cfg, err := dispatchconfig.Load(g.env())
	if err != nil {
		return
	}
	pool, store, err := g.connect(ctx)
	if err != nil {
		return
	}
	defer pool.Close()
	stats, err := store.Stats(ctx)
	if err != nil {
		return
	}
	missing := unroutedTopics(stats, cfg)
	for _, u := range missing {
		fmt.Fprintf(w, "warning: %s pending message%s in %s/%s match no route: dispatch will hold them as NO_ROUTE (retried with a capped backoff, never delivered) until a route covers them\n",
			count(u.pending), plural(int(u.pending)), u.namespace, u.topic)
	}
}

// unroutedTopics are the namespace/topic pairs of stats with pending
// messages that this dispatcher would claim (OUTBOX_NAMESPACES) but no
// route matches.
func unroutedTopics(stats []lease.TopicStats, cfg dispatchconfig.Dispatch) []unrouted {
	var out []unrouted
	for _, s := range stats {
		if s.Pending == 0 {
			continue
		}
		if ns := cfg.Engine.Namespaces; len(ns) > 0 && !slices.Contains(ns, s.Namespace) {
			continue
		}
		if cfg.Routes.Match(s.Namespace, s.Topic) == nil {
			out = append(out, unrouted{s.Namespace, s.Topic, s.Pending})
		}
	}
	return out
}
