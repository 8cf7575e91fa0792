package serve

import (
	"context"
	"fmt"
	"os"

	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
	"github.com/outboxkit/dispatcher/shared/handler/reaperfn"
)

// ListenApplicationName is the application_name of the listener's
// connection, which names it in pg_stat_activity.
const ListenApplicationName = "outbox-dispatcher/serve-listen"

// Open builds a server from its configuration exactly as the functions
// build themselves: the engine with dispatchfn.New (publishers, database
// pool), the reaper with reaperfn.New when setup has one and
// cfg.ReaperInterval is positive, and one more connection, from the same
// database settings, for LISTEN. cfg.Log defaults to the dispatch runtime's
// JSON logger and cfg.WorkerID to "serve@<host>:<random>". The returned
// function closes every pool; call it after Run returns.
func Open(ctx context.Context, setup dispatchconfig.Serve, deps handler.Deps, cfg Config) (*Server, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	h, closeDispatch, err := dispatchfn.New(ctx, setup.Dispatch, deps)
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, closeDispatch)

	var reaper *reaperfn.Handler
	if cfg.ReaperInterval > 0 && setup.Reaper != nil {
		r, closeReaper, err := reaperfn.New(ctx, *setup.Reaper, deps)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("reaper: %w", err)
		}
		closers = append(closers, closeReaper)
		reaper = r
	}

	connect, closeListen, err := dispatchfn.ListenConnector(ctx, setup.Dispatch.Database, deps, ListenApplicationName)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	closers = append(closers, closeListen)

	if cfg.Log == nil {
		cfg.Log = h.RT.Log
	}
	if cfg.Metrics == nil {
		cfg.Metrics = h.RT
	}
	if cfg.WorkerID == "" {
		host, _ := os.Hostname()
		cfg.WorkerID = handler.WorkerID(ctx, "serve@"+host)
	}
	var r Reaper
	if reaper != nil {
		r = reaper
	}
	s, err := New(cfg, h.Engine, r, connect)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return s, closeAll, nil
}
