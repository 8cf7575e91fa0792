package config

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/telemetry/logging"
	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
)

// with is base plus the pairs in kv.
func with(base map[string]string, kv ...string) map[string]string {
	m := map[string]string{}
	for k, v := range base {
		m[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func TestLoadReaper(t *testing.T) {
	t.Parallel()
	r, err := LoadReaper(env(map[string]string{"OUTBOX_DATABASE_URL": "postgres://db/x", "OUTBOX_ATTEMPT_CEILING": "7"}))
	if err != nil {
		t.Fatal(err)
	}
	want := lease.PurgeParams{AttemptsOlderThan: DefaultAttemptsRetention, DedupeOlderThan: DefaultDedupeRetention, KeysOlderThan: DefaultKeyRetention, MaxRows: DefaultPurgeRows}
	if r.BatchSize != DefaultReaperBatchSize || r.MaxRounds != DefaultReaperRounds || r.Retention != want || r.AttemptCeiling != 7 {
		t.Errorf("reaper %+v", r)
	}
	r, err = LoadReaper(env(map[string]string{"OUTBOX_DATABASE_URL": "postgres://db/x", "OUTBOX_ATTEMPTS_RETENTION": "0", "OUTBOX_KEY_RETENTION": "2h"}))
	if err != nil || r.Retention.AttemptsOlderThan != 0 || r.Retention.KeysOlderThan != 2*time.Hour {
		t.Errorf("retention %+v, err %v", r.Retention, err)
	}
	_, err = LoadReaper(env(map[string]string{"OUTBOX_DATABASE_URL": "postgres://db/x",
		"OUTBOX_ATTEMPTS_RETENTION": "5m", "OUTBOX_DEDUPE_RETENTION": "59m", "OUTBOX_KEY_RETENTION": "1s", "OUTBOX_REAPER_MAX_ROUNDS": "1001"}))
	for _, want := range []string{
		"OUTBOX_ATTEMPTS_RETENTION must be 0 (keep) or at least 1h: the archive is the audit trail, got 5m0s",
		"OUTBOX_DEDUPE_RETENTION must be 0 (keep) or at least 1h: a shorter window lets producer retries enqueue duplicates, got 59m0s",
		"OUTBOX_KEY_RETENTION must be 0 (keep) or at least 1h, got 1s",
		"OUTBOX_REAPER_MAX_ROUNDS must be between 1 and 1000, got 1001",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
}

func TestLoadReplayAndMetrics(t *testing.T) {
	t.Parallel()
	db := map[string]string{"OUTBOX_DATABASE_URL": "postgres://db/x"}
	r, err := LoadReplay(env(db))
	if err != nil || r.MaxLimit != DefaultReplayMaxLimit {
		t.Errorf("replay %+v, %v", r, err)
	}
	if _, err := LoadReplay(env(with(db, "OUTBOX_REPLAY_MAX_LIMIT", "10001"))); err == nil || !strings.Contains(err.Error(), "OUTBOX_REPLAY_MAX_LIMIT must be between 1 and 10000") {
		t.Errorf("replay: %v", err)
	}
	m, err := LoadMetrics(env(with(db, "OUTBOX_METRICS_NAMESPACE", "Billing/Outbox")))
	if err != nil || m.TopN != DefaultMetricsTopN || m.MetricsNamespace != "Billing/Outbox" {
		t.Errorf("metrics %+v, %v", m, err)
	}
	if _, err := LoadMetrics(env(with(db, "OUTBOX_METRICS_TOP_N", "1000"))); err == nil || !strings.Contains(err.Error(), "OUTBOX_METRICS_TOP_N must be between 1 and 100") {
		t.Errorf("metrics: %v", err)
	}
	if _, err := LoadMetrics(env(with(db, "OUTBOX_METRICS_NAMESPACE", "AWS/Lambda"))); err == nil || !strings.Contains(err.Error(), "OUTBOX_METRICS_NAMESPACE is not a CloudWatch namespace") {
		t.Errorf("metrics: %v", err)
	}
}

func TestLogLevel(t *testing.T) {
	t.Parallel()
	cases := []struct {
		env     map[string]string
		want    slog.Level
		wantErr string
	}{
		{nil, slog.LevelInfo, ""},
		{map[string]string{"OUTBOX_LOG_LEVEL": "debug"}, slog.LevelDebug, ""},
		{map[string]string{"OUTBOX_LOG_LEVEL": "WARN"}, slog.LevelWarn, ""},
		{map[string]string{"OUTBOX_LOG_LEVEL": "error"}, slog.LevelError, ""},
		{map[string]string{"OUTBOX_LOG_LEVEL": "verbose"}, slog.LevelInfo, `logging: OUTBOX_LOG_LEVEL="verbose": want debug, info, warn or error`},
		{map[string]string{"OUTBOX_LOG_LEVEL": "trace"}, slog.LevelInfo, "OUTBOX_LOG_LEVEL"},
		// Lambda's setting wins: it filters the records anyway.
		{map[string]string{"OUTBOX_LOG_LEVEL": "debug", "AWS_LAMBDA_LOG_LEVEL": "WARN"}, slog.LevelWarn, ""},
		{map[string]string{"AWS_LAMBDA_LOG_LEVEL": "TRACE"}, logging.LevelTrace, ""},
		{map[string]string{"AWS_LAMBDA_LOG_LEVEL": "FATAL"}, logging.LevelFatal, ""},
		{map[string]string{"AWS_LAMBDA_LOG_LEVEL": "LOUD"}, slog.LevelInfo, `logging: AWS_LAMBDA_LOG_LEVEL="LOUD": want TRACE, DEBUG, INFO, WARN, ERROR or FATAL`},
	}
	for _, tc := range cases {
		got, err := logLevel(env(tc.env).getenv())
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: error %v, want one naming %s", tc.env, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("%v: %v, %v; want %v", tc.env, got, err, tc.want)
		}
	}
}

func TestTracingSelection(t *testing.T) {
	t.Parallel()
	cases := []struct {
		env     map[string]string
		enabled bool
		reason  string
	}{
		{nil, false, "no X-Ray daemon"},
		{map[string]string{"AWS_XRAY_DAEMON_ADDRESS": "169.254.79.129:2000"}, true, "AWS_XRAY_DAEMON_ADDRESS is set"},
		{map[string]string{"AWS_XRAY_DAEMON_ADDRESS": "tcp:127.0.0.1:2000 udp:127.0.0.1:2001"}, true, "AWS_XRAY_DAEMON_ADDRESS is set"},
		{map[string]string{"_X_AMZN_TRACE_ID": "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"}, true, "_X_AMZN_TRACE_ID is set"},
		{map[string]string{"AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000", "OUTBOX_TRACING": "off"}, false, "OUTBOX_TRACING=off"},
		{map[string]string{"AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000", "OUTBOX_TRACING": "FALSE"}, false, "OUTBOX_TRACING=false"},
		{map[string]string{"AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000", "AWS_XRAY_SDK_DISABLED": "TRUE"}, false, "AWS_XRAY_SDK_DISABLED=true"},
		{map[string]string{"OUTBOX_TRACING": "on"}, true, "OUTBOX_TRACING=on"},
		{map[string]string{"OUTBOX_TRACING": " Auto "}, false, "no X-Ray daemon"},
		{map[string]string{"OUTBOX_TRACING": "on", "AWS_XRAY_SDK_DISABLED": "true"}, false, "AWS_XRAY_SDK_DISABLED=true"},
		{map[string]string{"OUTBOX_TRACING": "sometimes", "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000"}, false, `OUTBOX_TRACING="sometimes" is none of on, off, auto`},
		// The daemon's address is the tracer's to parse.
		{map[string]string{"AWS_XRAY_DAEMON_ADDRESS": "tcp:127.0.0.1:2000"}, false, "AWS_XRAY_DAEMON_ADDRESS="},
		{map[string]string{"AWS_XRAY_DAEMON_ADDRESS": "localhost:notaport"}, false, "AWS_XRAY_DAEMON_ADDRESS="},
	}
	for _, tc := range cases {
		e := env(tc.env)
		cfg := tracingConfig(e.getenv(), NewReader(e), lambdaRuntime(e.getenv()))
		tr := tracing.New(cfg)
		if tr.Enabled() != tc.enabled || !strings.Contains(tr.Reason(), tc.reason) {
			t.Errorf("%v: enabled %v (%s); want %v (%s)", tc.env, tr.Enabled(), tr.Reason(), tc.enabled, tc.reason)
		}
	}
}

// What the Lambda runtime says of the function is read at cold start, but
// the trace header at each invocation: the runtime sets it for each.
func TestLambdaRuntime(t *testing.T) {
	t.Parallel()
	vars := map[string]string{
		"OUTBOX_DATABASE_URL":             "postgres://db/x",
		"AWS_LAMBDA_FUNCTION_NAME":        "outbox-reaper",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
		"AWS_LAMBDA_INITIALIZATION_TYPE":  "provisioned-concurrency",
		"AWS_XRAY_DAEMON_ADDRESS":         "127.0.0.1:2000",
	}
	r, err := LoadReaper(env(vars))
	if err != nil {
		t.Fatal(err)
	}
	if l := r.Lambda; l.FunctionName != "outbox-reaper" || l.MemoryMB != 512 || !l.Provisioned || !r.Tracing.InLambda {
		t.Errorf("lambda %+v, tracing in Lambda %t", l, r.Tracing.InLambda)
	}
	if r.Lambda.TraceHeader() != "" {
		t.Error("a trace header before any invocation")
	}
	vars["_X_AMZN_TRACE_ID"] = "Root=1-5759e988-bd862e3fe1be46a994272793"
	if got := r.Tracing.TraceHeader(); got != vars["_X_AMZN_TRACE_ID"] {
		t.Errorf("the invocation's trace header = %q", got)
	}
	if LambdaRuntimeAPI(env(map[string]string{"AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001"})) != "127.0.0.1:9001" {
		t.Error("the runtime API's address")
	}
}

// --database-url replaces every database source; OUTBOX_DB_MAX_CONNS wins
// over a command's pool size.
func TestDatabaseForTheCLI(t *testing.T) {
	t.Parallel()
	e := env(map[string]string{"OUTBOX_DB_SECRET_ARN": testARN, "OUTBOX_DB_IAM_AUTH": "true", "OUTBOX_DB_STATEMENT_TIMEOUT": "1m"})
	if !DatabaseConfigured(e) || DatabaseConfigured(env(nil)) || DatabaseURL(e) != "" {
		t.Error("DatabaseConfigured or DatabaseURL")
	}
	flagged := e.WithDatabaseURL("postgres://cli@db/x")
	cfg, err := LoadDatabase(flagged, 16)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source != dbpool.SourceURL || DatabaseURL(flagged) != "postgres://cli@db/x" || cfg.MaxConns != 16 || cfg.StatementTimeout != time.Minute {
		t.Errorf("with --database-url: %v", cfg)
	}
	if e.WithDatabaseURL("").Getenv("OUTBOX_DB_SECRET_ARN") != testARN {
		t.Error("an empty --database-url changed the environment")
	}
	cfg, err = LoadDatabase(env(map[string]string{"OUTBOX_DATABASE_URL": "postgres://db/x", "OUTBOX_DB_MAX_CONNS": "3"}), 16)
	if err != nil || cfg.MaxConns != 3 {
		t.Errorf("OUTBOX_DB_MAX_CONNS=3 with a pool size of 16: %v, %v", cfg, err)
	}
}

func TestLoadDemo(t *testing.T) {
	t.Parallel()
	d := LoadDemo(env(map[string]string{"PGUSER": "me", "AWS_ENDPOINT_URL_SNS": "http://sns", "AWS_ENDPOINT_URL_EVENTBRIDGE": "http://eb", "AWS_PROFILE": "dev"}))
	if d != (Demo{PGUser: "me", AWSEndpoint: "http://sns", AWSCredentials: true}) {
		t.Errorf("demo %+v", d)
	}
}

// The soft memory limit comes from the function's memory size, leaving a
// fifth to what the Go runtime does not manage; a GOMEMLIMIT the deployer
// set is the runtime's own, and outside Lambda there is none.
func TestMemoryLimitFollowsTheFunctionsMemory(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		want int64
	}{
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256"}, 256 << 20 * 4 / 5},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769"}, 1769 << 20 * 4 / 5},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256", "GOMEMLIMIT": "100MiB"}, 0},
		{map[string]string{}, 0},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "lots"}, 0},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "0"}, 0},
	} {
		if got := MemoryLimit(env(tc.vars)); got != tc.want {
			t.Errorf("MemoryLimit(%v) = %d, want %d", tc.vars, got, tc.want)
		}
	}
}

// The collector's pace follows the function's memory inside Lambda; a
// GOGC the deployer set is the runtime's own, and outside Lambda the
// runtime's default stands.
func TestGCPercentRaisesThePaceOnlyInsideAFunction(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		want int
	}{
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256"}, FunctionGCPercent},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256", "GOMEMLIMIT": "100MiB"}, FunctionGCPercent},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256", "GOGC": "150"}, 0},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256", "GOGC": "off"}, 0},
		{map[string]string{}, 0},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "lots"}, 0},
	} {
		if got := GCPercent(env(tc.vars)); got != tc.want {
			t.Errorf("GCPercent(%v) = %d, want %d", tc.vars, got, tc.want)
		}
	}
}

// The scheduler's processors follow the vCPUs of time the function's
// memory buys, one below 1,769 MB; a GOMAXPROCS the deployer set is the
// runtime's own, and outside Lambda the runtime's default stands.
func TestMaxProcsFollowsTheFunctionsCPUShare(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		want int
	}{
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128"}, 1},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256"}, 1},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769"}, 1},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1770"}, 2},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "10240"}, 6},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256", "GOMAXPROCS": "4"}, 0},
		{map[string]string{}, 0},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "lots"}, 0},
		{map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "0"}, 0},
	} {
		if got := MaxProcs(env(tc.vars)); got != tc.want {
			t.Errorf("MaxProcs(%v) = %d, want %d", tc.vars, got, tc.want)
		}
	}
}
