package serve

import (
	"context"
	"fmt"
	"os"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
	"github.com/outboxkit/dispatcher/shared/pgconn"
)

// ListenApplicationName is the application_name of the listener's
// connection, which names it in pg_stat_activity.
const ListenApplicationName = "outbox-dispatcher/serve-listen"

// Open builds a server from the environment exactly as the functions build
// themselves: the engine with dispatchfn.New (routes, publishers, database
// pool), the reaper with handler.NewReaper when cfg.ReaperInterval is
// positive, and one more connection, from the same database settings, for
// LISTEN. cfg.Log defaults to the dispatch runtime's JSON logger and
// cfg.WorkerID to "serve@<host>:<random>". The returned function closes
// every pool; call it after Run returns.
func Open(ctx context.Context, env handler.Env, cfg Config) (*Server, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	h, closeDispatch, err := dispatchfn.New(ctx, env)
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, closeDispatch)

	var reaper *handler.Reaper
	if cfg.ReaperInterval > 0 {
		r, closeReaper, err := handler.NewReaper(ctx, env)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("reaper: %w", err)
		}
		closers = append(closers, closeReaper)
		reaper = r
	}

	listenPool, err := openListenPool(ctx, env)
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
// database settings (a URL, a Secrets Manager secret or RDS IAM), already
// validated by dispatchfn.New.
func openListenPool(ctx context.Context, env handler.Env) (*pgxpool.Pool, error) {
	dbCfg, err := pgconn.LoadConfig(env.Getenv)
	if err != nil {
		return nil, err
	}
	dbCfg.MaxConns = 1
	var deps pgconn.Deps
	if env.AWS != nil {
		deps.AWS = env.AWS.Copy()
	} else if dbCfg.Source != pgconn.SourceURL {
		// Only a secret or an IAM token needs AWS.
		if deps.AWS, err = awsconfig.LoadDefaultConfig(ctx); err != nil {
			return nil, fmt.Errorf("load the AWS configuration: %w", err)
		}
	}
	deps.ApplicationName = ListenApplicationName
	pool, err := pgconn.Open(ctx, dbCfg, deps)
	if err != nil {
		return nil, fmt.Errorf("the notification listener's connection: %w", err)
	}
	return pool, nil
}
