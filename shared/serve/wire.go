package serve

import (
	"context"
	"fmt"
	"os"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/dbpool"
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

	listenPool, err := openListenPool(ctx, setup.Dispatch.Database, deps)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	closers = append(closers, listenPool.Close)
	connect := func(ctx context.Context) (*pgx.Conn, error) {
		c, err := listenPool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		// The listener owns its connection for as long as it lives; a
		// failed one is closed, and the pool opens the next.
		return c.Hijack(), nil
	}

	if cfg.Log == nil {
		cfg.Log = h.RT.Log
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

// openListenPool opens a one-connection pool from the dispatch function's
// database settings (a URL, a Secrets Manager secret or RDS IAM).
func openListenPool(ctx context.Context, dbCfg dbpool.Config, deps handler.Deps) (*pgxpool.Pool, error) {
	dbCfg.MaxConns = 1
	var pd dbpool.Deps
	if deps.AWS != nil {
		pd.AWS = deps.AWS.Copy()
	} else if dbCfg.Source != dbpool.SourceURL {
		// Only a secret or an IAM token needs AWS.
		var err error
		if pd.AWS, err = awsconfig.LoadDefaultConfig(ctx); err != nil {
			return nil, fmt.Errorf("load the AWS configuration: %w", err)
		}
	}
	pd.ApplicationName = ListenApplicationName
	pool, err := dbpool.Open(ctx, dbCfg, pd)
	if err != nil {
		return nil, fmt.Errorf("the notification listener's connection: %w", err)
	}
	return pool, nil
}
