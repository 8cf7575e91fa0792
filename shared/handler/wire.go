package handler

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/telemetry/logging"
	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
)

// Deps are what a function's handler is built with besides its
// configuration; the zero value is what a Lambda function uses.
type Deps struct {
	// Stdout receives the JSON logs and the metrics documents (nil:
	// os.Stdout).
	Stdout io.Writer
	// AWS, when set, is used instead of the SDK's default configuration.
	AWS *aws.Config
}

// Common is what every function builds at its cold start: the runtime,
// the pool, the store and the AWS configuration.
type Common struct {
	RT    *Runtime
	Pool  *dbpool.Pool
	Store *lease.Store
	AWS   aws.Config
}

// Close releases the pool.
func (c *Common) Close() {
	if c.Pool != nil {
		c.Pool.Close()
	}
}

// NewRuntime builds the runtime of a function: its logger, tracer and
// metrics destination.
func NewRuntime(function string, cfg config.Function, deps Deps) *Runtime {
	out := deps.Stdout
	if out == nil {
		out = os.Stdout
	}
	rt := &Runtime{
		Function:         function,
		Log:              logging.New(out, function, cfg.LogLevel),
		Tracer:           tracing.New(cfg.Tracing),
		MetricsNamespace: cfg.MetricsNamespace,
		MetricsOut:       out,
		Lambda:           cfg.Lambda,
	}
	rt.cold.Provisioned = cfg.Lambda.Provisioned
	return rt
}

// Connect opens the pool (with query tracing) and loads the AWS
// configuration, once per cold start.
func Connect(ctx context.Context, function string, cfg config.Function, deps Deps, rt *Runtime, ceiling int) (*Common, error) {
	var awsCfg aws.Config
	if deps.AWS != nil {
		awsCfg = deps.AWS.Copy()
	} else {
		var err error
		if awsCfg, err = awsconfig.LoadDefaultConfig(ctx); err != nil {
			return nil, fmt.Errorf("load the AWS configuration: %w", err)
		}
	}
	rt.Tracer.InstrumentAWS(&awsCfg)
	pool, err := dbpool.Open(ctx, cfg.Database, dbpool.Deps{
		AWS: awsCfg, ApplicationName: "outbox-dispatcher/" + function, Logger: rt.Log,
		ConfigurePool: func(c *pgxpool.Config) { c.ConnConfig.Tracer = rt.Tracer.PgxTracer() },
	})
	if err != nil {
		return nil, err
	}
	store := lease.NewStore(pool)
	store.AttemptCeiling = ceiling
	gogc, limitMiB := collectorSettings()
	rt.Log.Info("cold start", "tracing", rt.Tracer.Enabled(), "tracing_reason", rt.Tracer.Reason(), "database", cfg.Database.String(),
		"gogc", gogc, "memory_limit_mib", limitMiB, "gomaxprocs", runtime.GOMAXPROCS(0))
	return &Common{RT: rt, Pool: pool, Store: store, AWS: awsCfg}, nil
}
