package config

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/pgconn"
	"github.com/outboxkit/dispatcher/shared/route"
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
	Database         pgconn.Config
	Lambda           logging.Lambda
}

// Dispatch is the dispatch function's configuration.
type Dispatch struct {
	Function
	Engine dispatch.Config
	// AttemptCeiling bounds the attempts of every message: the store's,
	// and every route's max_attempts (Routes was checked against it).
	AttemptCeiling int
	Routes         *route.Table
	// SigningSecrets holds the value of each variable a route's
	// signing_secret_env names ("" when it is unset), for the webhook
	// targets to decode.
	SigningSecrets map[string]string
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

// Serve is outboxctl serve's configuration: the dispatch function's, and
// the reaper's when the server runs one.
type Serve struct {
	Dispatch Dispatch
	// Reaper is nil when the server runs no reaper.
	Reaper *Reaper
}

// ErrNoRoutes is wrapped by the error of a dispatch configuration without
// OUTBOX_ROUTES or OUTBOX_ROUTES_FILE.
var ErrNoRoutes = errors.New("route: no routes configured")

// engineNames names the engine's settings in its messages.
var engineNames = dispatch.Names{
	BatchSize:         "OUTBOX_BATCH_SIZE",
	MaxBatches:        "OUTBOX_MAX_BATCHES",
	Lease:             "OUTBOX_LEASE",
	SafetyMargin:      "OUTBOX_SAFETY_MARGIN",
	OrderedRun:        "OUTBOX_ORDERED_RUN",
	BatchBytes:        "OUTBOX_BATCH_MAX_BYTES",
	TargetConcurrency: "OUTBOX_TARGET_CONCURRENCY",
}

// LoadDispatch reads the dispatch function's configuration: every problem
// (logging, database, engine limits, routes) is reported at once.
func LoadDispatch(env Env) (Dispatch, error) {
	fn, problems := loadFunction(env)
	d, more := loadDispatch(env, fn)
	if problems = append(problems, more...); len(problems) > 0 {
		return Dispatch{}, errors.Join(problems...)
	}
	return d, nil
}

// LoadReaper reads the reaper function's configuration.
func LoadReaper(env Env) (Reaper, error) {
	fn, problems := loadFunction(env)
	r := newReader(env)
	c := loadReaper(r, fn)
	if err := r.err(); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return Reaper{}, errors.Join(problems...)
	}
	return c, nil
}

// LoadReplay reads the dead-letter replay function's configuration.
func LoadReplay(env Env) (Replay, error) {
	fn, problems := loadFunction(env)
	maxLimit, err := ReplayMaxLimit(env)
	if err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return Replay{}, errors.Join(problems...)
	}
	return Replay{Function: fn, MaxLimit: maxLimit}, nil
}

// LoadMetrics reads the metrics function's configuration.
func LoadMetrics(env Env) (Metrics, error) {
	fn, problems := loadFunction(env)
	r := newReader(env)
	topN := r.int("OUTBOX_METRICS_TOP_N")
	if err := r.err(); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return Metrics{}, errors.Join(problems...)
	}
	return Metrics{Function: fn, TopN: topN}, nil
}

// LoadServe reads outboxctl serve's configuration: the dispatch
// function's, and with reaper the reaper's, every problem at once.
func LoadServe(env Env, reaper bool) (Serve, error) {
	fn, problems := loadFunction(env)
	d, more := loadDispatch(env, fn)
	problems = append(problems, more...)
	var s Serve
	if reaper {
		r := newReader(env)
		c := loadReaper(r, fn)
		if err := r.err(); err != nil {
			problems = append(problems, err)
		}
		s.Reaper = &c
	}
	if len(problems) > 0 {
		return Serve{}, errors.Join(problems...)
	}
	s.Dispatch = d
	return s, nil
}

// ReplayMaxLimit reads OUTBOX_REPLAY_MAX_LIMIT, which outboxctl replay
// honours as the function does.
func ReplayMaxLimit(env Env) (int, error) {
	r := newReader(env)
	n := r.int("OUTBOX_REPLAY_MAX_LIMIT")
	return n, r.err()
}

// loadFunction reads what every function shares.
func loadFunction(env Env) (Function, []error) {
	getenv := env.getenv()
	var problems []error
	level, err := logLevel(getenv)
	if err != nil {
		problems = append(problems, err)
	}
	r := newReader(env)
	namespace := r.string("OUTBOX_METRICS_NAMESPACE")
	if _, err := emf.New(namespace); err != nil {
		r.fail("OUTBOX_METRICS_NAMESPACE", "is not a CloudWatch namespace: %v", err)
	}
	if err := r.err(); err != nil {
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
	}, problems
}

// loadDispatch reads the dispatch variables and the routes.
func loadDispatch(env Env, fn Function) (Dispatch, []error) {
	var problems []error
	r := newReader(env)
	d := Dispatch{
		Function: fn,
		Engine: dispatch.Config{
			BatchSize:         r.int("OUTBOX_BATCH_SIZE"),
			MaxBatches:        r.int("OUTBOX_MAX_BATCHES"),
			Namespaces:        r.list("OUTBOX_NAMESPACES"),
			FunctionTimeout:   r.duration("OUTBOX_FUNCTION_TIMEOUT"),
			SafetyMargin:      r.duration("OUTBOX_SAFETY_MARGIN"),
			TargetConcurrency: r.int("OUTBOX_TARGET_CONCURRENCY"),
			OrderedRun:        r.int("OUTBOX_ORDERED_RUN"),
			BatchBytes:        int64(r.int("OUTBOX_BATCH_MAX_BYTES")),
			Names:             engineNames,
		},
		AttemptCeiling: attemptCeiling(r),
	}
	for _, ns := range d.Engine.Namespaces {
		if !outbox.NamePattern.MatchString(ns) {
			r.fail("OUTBOX_NAMESPACES", "contains %q, which is not a namespace", ns)
		}
	}
	if r.isSet("OUTBOX_LEASE") {
		d.Engine.Lease = r.duration("OUTBOX_LEASE")
	} else if d.Engine.FunctionTimeout > 0 {
		d.Engine.Lease = d.Engine.FunctionTimeout + d.Engine.SafetyMargin + LeaseSlack
	}
	if err := r.err(); err != nil {
		problems = append(problems, err)
	} else if err := d.Engine.Validate(); err != nil {
		// The engine's own checks, the lease against the timeout above all.
		problems = append(problems, err)
	}
	// The routes are checked against the ceiling the store will apply.
	routes, err := loadRoutes(env, route.Options{AttemptCeiling: d.AttemptCeiling})
	if err != nil {
		problems = append(problems, err)
	} else {
		d.Routes = routes
		d.SigningSecrets = signingSecrets(env, routes)
	}
	return d, problems
}

// loadReaper reads the reaper variables.
func loadReaper(r *reader, fn Function) Reaper {
	c := Reaper{
		Function:  fn,
		BatchSize: r.int("OUTBOX_REAPER_BATCH_SIZE"),
		MaxRounds: r.int("OUTBOX_REAPER_MAX_ROUNDS"),
		Retention: lease.PurgeParams{
			AttemptsOlderThan: r.duration("OUTBOX_ATTEMPTS_RETENTION"),
			DedupeOlderThan:   r.duration("OUTBOX_DEDUPE_RETENTION"),
			KeysOlderThan:     r.duration("OUTBOX_KEY_RETENTION"),
			MaxRows:           r.int("OUTBOX_PURGE_MAX_ROWS"),
		},
		AttemptCeiling: attemptCeiling(r),
	}
	if d := c.Retention.AttemptsOlderThan; d > 0 && d < MinRetention {
		r.fail("OUTBOX_ATTEMPTS_RETENTION", "must be 0 (keep) or at least %s: the archive is the audit trail, got %s", shortDuration(MinRetention), d)
	}
	if d := c.Retention.DedupeOlderThan; d > 0 && d < MinRetention {
		r.fail("OUTBOX_DEDUPE_RETENTION", "must be 0 (keep) or at least %s: a shorter window lets producer retries enqueue duplicates, got %s", shortDuration(MinRetention), d)
	}
	if d := c.Retention.KeysOlderThan; d > 0 && d < MinRetention {
		r.fail("OUTBOX_KEY_RETENTION", "must be 0 (keep) or at least %s, got %s", shortDuration(MinRetention), d)
	}
	return c
}

// attemptCeiling reads OUTBOX_ATTEMPT_CEILING, the attempts after which the
// database dead-letters a message whatever its route says. The dispatch
// function gives the same value to the store and to the routes, whose
// retry.max_attempts it bounds; the reaper gives it to the store.
func attemptCeiling(r *reader) int { return r.int("OUTBOX_ATTEMPT_CEILING") }

// loadRoutes reads the routes named by OUTBOX_ROUTES (the configuration as
// text) or OUTBOX_ROUTES_FILE (a path): exactly one must be set. An
// invalid configuration is a *route.ConfigError whose Source names the
// variable (and the file).
func loadRoutes(env Env, opts route.Options) (*route.Table, error) {
	const textVar, fileVar = "OUTBOX_ROUTES", "OUTBOX_ROUTES_FILE"
	mustLookup(textVar)
	mustLookup(fileVar)
	getenv := env.getenv()
	text, path := getenv(textVar), getenv(fileVar)
	var (
		data   []byte
		source string
	)
	switch {
	case text != "" && path != "":
		return nil, fmt.Errorf("route: both %s and %s are set; set exactly one", textVar, fileVar)
	case text == "" && path == "":
		return nil, fmt.Errorf("%w: set %s (the configuration as JSON) or %s (the path of a JSON or YAML file)",
			ErrNoRoutes, textVar, fileVar)
	case text != "":
		data, source = []byte(text), textVar
	default:
		var err error
		if data, err = env.readFile()(path); err != nil {
			return nil, fmt.Errorf("route: %s: reading %q: %w", fileVar, path, err)
		}
		source = fmt.Sprintf("%s %q", fileVar, path)
	}
	t, err := route.Parse(data, opts)
	if err != nil {
		if ce, ok := errors.AsType[*route.ConfigError](err); ok {
			ce.Source = source
		}
		return nil, err
	}
	return t, nil
}

// signingSecrets reads the variables the routes' signing_secret_env name.
func signingSecrets(env Env, routes *route.Table) map[string]string {
	getenv := env.getenv()
	secrets := map[string]string{}
	for _, r := range routes.Routes {
		if name := r.Target.SigningSecretEnv; name != "" {
			secrets[name] = getenv(name)
		}
	}
	return secrets
}

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
func tracingConfig(getenv func(string) string, r *reader, lambda logging.Lambda) tracing.Config {
	cfg := tracing.Config{
		DaemonAddress: getenv("AWS_XRAY_DAEMON_ADDRESS"),
		InLambda:      lambda.FunctionName != "",
		TraceHeader:   lambda.TraceHeader,
	}
	cfg.Enabled, cfg.Reason = decideTracing(getenv, strings.ToLower(r.raw("OUTBOX_TRACING")))
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
