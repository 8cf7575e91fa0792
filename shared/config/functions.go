package config

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
	"github.com/outboxkit/dispatcher/shared/telemetry/logging"
	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
)

// Function is what every function is configured with: its logs, traces,
// metrics and database, and what the Lambda runtime says of it.
type Function struct {
	LogLevel slog.Level
	Tracing  tracing.Config
	// MetricsNamespace is the CloudWatch namespace of every metric.
	MetricsNamespace string
	Database         dbpool.Config
	Lambda           logging.Lambda
}

// Reaper is the reaper function's configuration.
type Reaper struct {
	Function
	// BatchSize is the expired leases repaired per round; MaxRounds bounds
	// the repair rounds and, separately, the purge rounds.
	BatchSize int
	MaxRounds int
	Retention lease.PurgeParams
	// AttemptCeiling is the store's attempt ceiling.
	AttemptCeiling int
}

// Replay is the dead-letter replay function's configuration.
type Replay struct {
	Function
	// MaxLimit caps an event's limit.
	MaxLimit int
}

// Metrics is the metrics function's configuration.
type Metrics struct {
	Function
	// TopN bounds the namespace/topic pairs reported one by one.
	TopN int
}

// LoadReaper reads the reaper function's configuration.
func LoadReaper(env Env) (Reaper, error) {
	fn, err := LoadFunction(env)
	r := NewReader(env)
	c := ReadReaper(r, fn)
	if err := errors.Join(err, r.Err()); err != nil {
		return Reaper{}, err
	}
	return c, nil
}

// LoadReplay reads the dead-letter replay function's configuration.
func LoadReplay(env Env) (Replay, error) {
	fn, err := LoadFunction(env)
	maxLimit, limitErr := ReplayMaxLimit(env)
	if err := errors.Join(err, limitErr); err != nil {
		return Replay{}, err
	}
	return Replay{Function: fn, MaxLimit: maxLimit}, nil
}

// LoadMetrics reads the metrics function's configuration.
func LoadMetrics(env Env) (Metrics, error) {
	fn, err := LoadFunction(env)
	r := NewReader(env)
	topN := r.Int("OUTBOX_METRICS_TOP_N")
	if err := errors.Join(err, r.Err()); err != nil {
		return Metrics{}, err
	}
	return Metrics{Function: fn, TopN: topN}, nil
}

// ReplayMaxLimit reads OUTBOX_REPLAY_MAX_LIMIT, which outboxctl replay
// honours as the function does.
func ReplayMaxLimit(env Env) (int, error) {
	r := NewReader(env)
	n := r.Int("OUTBOX_REPLAY_MAX_LIMIT")
	return n, r.Err()
}

// LoadFunction reads what every function shares. It returns the
// configuration with the error, for a caller that goes on reading to
// report every problem at once.
func LoadFunction(env Env) (Function, error) {
	getenv := env.getenv()
	var problems []error
	level, err := logLevel(getenv)
	if err != nil {
		problems = append(problems, err)
	}
	r := NewReader(env)
	namespace := r.String("OUTBOX_METRICS_NAMESPACE")
	if _, err := emf.New(namespace); err != nil {
		r.Fail("OUTBOX_METRICS_NAMESPACE", "is not a CloudWatch namespace: %v", err)
	}
	if err := r.Err(); err != nil {
		problems = append(problems, err)
	}
	db, err := LoadDatabase(env, 0)
	if err != nil {
		problems = append(problems, err)
	}
	lambda := lambdaRuntime(getenv)
	return Function{
		LogLevel:         level,
		Tracing:          tracingConfig(getenv, r, lambda),
		MetricsNamespace: namespace,
		Database:         db,
		Lambda:           lambda,
	}, errors.Join(problems...)
}

// ReadReaper reads the reaper's own variables with r, which collects their
// problems.
func ReadReaper(r *Reader, fn Function) Reaper {
	c := Reaper{
		Function:  fn,
		BatchSize: r.Int("OUTBOX_REAPER_BATCH_SIZE"),
		MaxRounds: r.Int("OUTBOX_REAPER_MAX_ROUNDS"),
		Retention: lease.PurgeParams{
			AttemptsOlderThan: r.Duration("OUTBOX_ATTEMPTS_RETENTION"),
			DedupeOlderThan:   r.Duration("OUTBOX_DEDUPE_RETENTION"),
			KeysOlderThan:     r.Duration("OUTBOX_KEY_RETENTION"),
			MaxRows:           r.Int("OUTBOX_PURGE_MAX_ROWS"),
		},
		AttemptCeiling: AttemptCeiling(r),
	}
	if d := c.Retention.AttemptsOlderThan; d > 0 && d < MinRetention {
		r.Fail("OUTBOX_ATTEMPTS_RETENTION", "must be 0 (keep) or at least %s: the archive is the audit trail, got %s", shortDuration(MinRetention), d)
	}
	if d := c.Retention.DedupeOlderThan; d > 0 && d < MinRetention {
		r.Fail("OUTBOX_DEDUPE_RETENTION", "must be 0 (keep) or at least %s: a shorter window lets producer retries enqueue duplicates, got %s", shortDuration(MinRetention), d)
	}
	if d := c.Retention.KeysOlderThan; d > 0 && d < MinRetention {
		r.Fail("OUTBOX_KEY_RETENTION", "must be 0 (keep) or at least %s, got %s", shortDuration(MinRetention), d)
	}
	return c
}

// AttemptCeiling reads OUTBOX_ATTEMPT_CEILING, the attempts after which the
// database dead-letters a message whatever its route says. The dispatch
// function gives the same value to the store and to the routes, whose
// retry.max_attempts it bounds; the reaper gives it to the store.
func AttemptCeiling(r *Reader) int { return r.Int("OUTBOX_ATTEMPT_CEILING") }

// logLevel reads the log level: AWS_LAMBDA_LOG_LEVEL when set (Lambda's
// advanced logging controls drop JSON records below it anyway, so logging
// them would only cost), else OUTBOX_LOG_LEVEL (debug, info, warn or error;
// any case), else info.
func logLevel(getenv func(string) string) (slog.Level, error) {
	if v := getenv("AWS_LAMBDA_LOG_LEVEL"); v != "" {
		if l, ok := logging.ParseLevel(v, true); ok {
			return l, nil
		}
		return slog.LevelInfo, fmt.Errorf("logging: AWS_LAMBDA_LOG_LEVEL=%q: want TRACE, DEBUG, INFO, WARN, ERROR or FATAL", v)
	}
	if v := getenv("OUTBOX_LOG_LEVEL"); v != "" {
		if l, ok := logging.ParseLevel(v, false); ok {
			return l, nil
		}
		return slog.LevelInfo, fmt.Errorf("logging: OUTBOX_LOG_LEVEL=%q: want debug, info, warn or error", v)
	}
	return slog.LevelInfo, nil
}

// lambdaRuntime reads what the Lambda runtime says of the function.
func lambdaRuntime(getenv func(string) string) logging.Lambda {
	memory, _ := strconv.Atoi(getenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"))
	return logging.Lambda{
		FunctionName: getenv("AWS_LAMBDA_FUNCTION_NAME"),
		MemoryMB:     memory,
		Provisioned:  getenv("AWS_LAMBDA_INITIALIZATION_TYPE") == "provisioned-concurrency",
		// Set for each invocation, so read at each.
		TraceHeader: func() string { return getenv("_X_AMZN_TRACE_ID") },
	}
}

// tracingConfig decides whether to trace, by the rule in the package
// documentation. It never fails: a value it cannot use disables tracing,
// and the reason says why.
func tracingConfig(getenv func(string) string, r *Reader, lambda logging.Lambda) tracing.Config {
	cfg := tracing.Config{
		DaemonAddress: getenv("AWS_XRAY_DAEMON_ADDRESS"),
		InLambda:      lambda.FunctionName != "",
		TraceHeader:   lambda.TraceHeader,
	}
	cfg.Enabled, cfg.Reason = decideTracing(getenv, strings.ToLower(r.Raw("OUTBOX_TRACING")))
	return cfg
}

func decideTracing(getenv func(string) string, mode string) (enabled bool, reason string) {
	forced := false
	switch mode {
	case "off", "false", "0", "disabled":
		return false, "OUTBOX_TRACING=" + mode
	case "on", "true", "1", "enabled":
		forced = true
	case "auto":
	default:
		return false, fmt.Sprintf("OUTBOX_TRACING=%q is none of on, off, auto", mode)
	}
	if strings.EqualFold(strings.TrimSpace(getenv("AWS_XRAY_SDK_DISABLED")), "true") {
		return false, "AWS_XRAY_SDK_DISABLED=true"
	}
	switch {
	case forced:
		return true, "OUTBOX_TRACING=on"
	case getenv("AWS_XRAY_DAEMON_ADDRESS") != "":
		return true, "AWS_XRAY_DAEMON_ADDRESS is set"
	case getenv("_X_AMZN_TRACE_ID") != "":
		return true, "_X_AMZN_TRACE_ID is set"
	}
	return false, "no X-Ray daemon (AWS_XRAY_DAEMON_ADDRESS unset, not on Lambda with tracing)"
}

// SinkSecretVariable holds the signing secret of outboxctl sink; the demo's
// webhook route names it in signing_secret_env.
const SinkSecretVariable = "OUTBOX_SINK_SECRET"

// SinkSecret is outboxctl sink's signing secret (SinkSecretVariable), ""
// when unset.
func SinkSecret(env Env) string { return env.getenv()(SinkSecretVariable) }

// Demo is what outboxctl demo reads of the environment besides the
// database: which local server user to try, and the AWS emulator.
type Demo struct {
	// PGUser is libpq's PGUSER.
	PGUser string
	// AWSEndpoint is the first of AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_SNS
	// and AWS_ENDPOINT_URL_EVENTBRIDGE that is set.
	AWSEndpoint string
	// AWSCredentials says AWS_ACCESS_KEY_ID or AWS_PROFILE is set.
	AWSCredentials bool
}

// LoadDemo reads what outboxctl demo needs.
func LoadDemo(env Env) Demo {
	getenv := env.getenv()
	d := Demo{
		PGUser:         getenv("PGUSER"),
		AWSCredentials: getenv("AWS_ACCESS_KEY_ID") != "" || getenv("AWS_PROFILE") != "",
	}
	for _, v := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SNS", "AWS_ENDPOINT_URL_EVENTBRIDGE"} {
		if d.AWSEndpoint = getenv(v); d.AWSEndpoint != "" {
			break
		}
	}
	return d
}
