package handler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/pgconn"
	"github.com/outboxkit/dispatcher/shared/settings"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
	"github.com/outboxkit/dispatcher/shared/telemetry/logging"
	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
)

// Env is what a process hands the builders: the environment, and where
// logs and metrics go. The functions' main packages pass the real ones; the
// CLI and tests pass their own.
type Env struct {
	Getenv   func(string) string
	ReadFile func(string) ([]byte, error)
	// Stdout receives the JSON logs and the metrics documents.
	Stdout io.Writer
	// AWS, when set, is used instead of the SDK's default configuration.
	AWS *aws.Config
}

// OSEnv is the process's real environment.
func OSEnv() Env { return Env{Getenv: os.Getenv, ReadFile: os.ReadFile, Stdout: os.Stdout} }

// Common is what every function builds at its cold start: the runtime,
// the pool, the store and the AWS configuration.
type Common struct {
	RT    *Runtime
	Pool  *pgxpool.Pool
	Store *lease.Store
	AWS   aws.Config
}

// Close releases the pool.
func (c *Common) Close() {
	if c.Pool != nil {
		c.Pool.Close()
	}
}

// LoadCommon reads every shared setting — logging, metrics, database — and
// reports all problems at once, before anything connects.
func LoadCommon(function string, env Env) (pgconn.Config, *Runtime, []error) {
	var problems []error
	level, err := logging.LevelFromEnv(env.Getenv)
	if err != nil {
		problems = append(problems, err)
	}
	r := settings.NewReader(env.Getenv)
	namespace := r.String("OUTBOX_METRICS_NAMESPACE")
	if _, err := emf.New(namespace); err != nil {
		r.Fail("OUTBOX_METRICS_NAMESPACE", "is not a CloudWatch namespace: %v", err)
	}
	if err := r.Err(); err != nil {
		problems = append(problems, err)
	}
	dbCfg, err := pgconn.LoadConfig(env.Getenv)
	if err != nil {
		problems = append(problems, err)
	}
	out := env.Stdout
	if out == nil {
		out = os.Stdout
	}
	rt := &Runtime{
		Function:         function,
		Log:              logging.New(out, function, level),
		Tracer:           tracing.New(env.Getenv),
		MetricsNamespace: namespace,
		MetricsOut:       out,
	}
	return dbCfg, rt, problems
}

// Connect opens the pool (with query tracing) and loads the AWS
// configuration, once per cold start.
func Connect(ctx context.Context, function string, env Env, dbCfg pgconn.Config, rt *Runtime, ceiling int) (*Common, error) {
	var awsCfg aws.Config
	if env.AWS != nil {
		awsCfg = env.AWS.Copy()
	} else {
		var err error
		if awsCfg, err = awsconfig.LoadDefaultConfig(ctx); err != nil {
			return nil, fmt.Errorf("load the AWS configuration: %w", err)
		}
	}
	rt.Tracer.InstrumentAWS(&awsCfg)
	pool, err := pgconn.Open(ctx, dbCfg, pgconn.Deps{
		AWS: awsCfg, ApplicationName: "outbox-dispatcher/" + function, Logger: rt.Log,
		ConfigurePool: func(c *pgxpool.Config) { c.ConnConfig.Tracer = rt.Tracer.PgxTracer() },
	})
	if err != nil {
		return nil, err
	}
	store := lease.NewStore(pool)
	store.AttemptCeiling = ceiling
	rt.Log.Info("cold start", "tracing", rt.Tracer.Enabled(), "tracing_reason", rt.Tracer.Reason(), "database", dbCfg.String())
	return &Common{RT: rt, Pool: pool, Store: store, AWS: awsCfg}, nil
}

// NewReaper builds the reaper handler from the environment.
func NewReaper(ctx context.Context, env Env) (*Reaper, func(), error) {
	const function = "reaper"
	dbCfg, rt, problems := LoadCommon(function, env)
	cfg, ceiling, err := LoadReaperSettings(env.Getenv)
	if err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return nil, nil, errors.Join(problems...)
	}
	c, err := Connect(ctx, function, env, dbCfg, rt, ceiling)
	if err != nil {
		return nil, nil, err
	}
	cfg.WorkerPrefix = rt.FunctionName()
	return &Reaper{Store: c.Store, Config: cfg, RT: rt}, c.Close, nil
}

// NewReplay builds the dead-letter replay handler from the environment.
func NewReplay(ctx context.Context, env Env) (*Replay, func(), error) {
	const function = "dlq-replay"
	dbCfg, rt, problems := LoadCommon(function, env)
	maxLimit, err := LoadReplaySettings(env.Getenv)
	if err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return nil, nil, errors.Join(problems...)
	}
	c, err := Connect(ctx, function, env, dbCfg, rt, 0)
	if err != nil {
		return nil, nil, err
	}
	return &Replay{Store: c.Store, MaxLimit: maxLimit, WorkerPrefix: rt.FunctionName(), RT: rt}, c.Close, nil
}

// NewMetrics builds the metrics exporter's handler from the environment.
func NewMetrics(ctx context.Context, env Env) (*Metrics, func(), error) {
	const function = "metrics"
	dbCfg, rt, problems := LoadCommon(function, env)
	r := settings.NewReader(env.Getenv)
	topN := r.Int("OUTBOX_METRICS_TOP_N", 1, 100)
	if err := r.Err(); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return nil, nil, errors.Join(problems...)
	}
	c, err := Connect(ctx, function, env, dbCfg, rt, 0)
	if err != nil {
		return nil, nil, err
	}
	return &Metrics{Store: c.Store, TopN: topN, RT: rt}, c.Close, nil
}
