package config

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/pgconn"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/telemetry/logging"
	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
)

const goodRoutes = `{"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"http","url":"https://x.example/","signing_secret_env":"HOOK_SECRET"}}]}`

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

var minimal = map[string]string{"OUTBOX_DATABASE_URL": "postgres://app@db/outbox", "OUTBOX_ROUTES": goodRoutes}

func TestLoadDispatchDefaults(t *testing.T) {
	t.Parallel()
	d, err := LoadDispatch(env(with(minimal, "HOOK_SECRET", "whsec_x")))
	if err != nil {
		t.Fatal(err)
	}
	e := d.Engine
	if e.BatchSize != dispatch.DefaultBatchSize || e.MaxBatches != dispatch.DefaultMaxBatches || e.SafetyMargin != dispatch.DefaultSafetyMargin ||
		e.TargetConcurrency != dispatch.DefaultTargetConcurrency || e.OrderedRun != dispatch.DefaultOrderedRun || e.BatchBytes != dispatch.DefaultBatchBytes ||
		e.Lease != 0 || e.FunctionTimeout != 0 || e.Namespaces != nil || e.Names != engineNames {
		t.Errorf("engine %+v, want the defaults", e)
	}
	if d.AttemptCeiling != lease.DefaultAttemptCeiling || len(d.Routes.Routes) != 1 {
		t.Errorf("ceiling %d, %d routes", d.AttemptCeiling, len(d.Routes.Routes))
	}
	if d.SigningSecrets["HOOK_SECRET"] != "whsec_x" || len(d.SigningSecrets) != 1 {
		t.Errorf("signing secrets %v, want the one the route names", d.SigningSecrets)
	}
	if d.LogLevel != slog.LevelInfo || d.MetricsNamespace != DefaultMetricsNamespace || d.Database.Source != pgconn.SourceURL || d.Tracing.Enabled {
		t.Errorf("function %+v", d.Function)
	}
}

func TestLoadDispatchLease(t *testing.T) {
	t.Parallel()
	d, err := LoadDispatch(env(with(minimal, "OUTBOX_FUNCTION_TIMEOUT", "5m", "OUTBOX_SAFETY_MARGIN", "20s")))
	if err != nil {
		t.Fatal(err)
	}
	if want := 5*time.Minute + 20*time.Second + LeaseSlack; d.Engine.Lease != want {
		t.Errorf("lease %s, want the timeout plus the margin plus %s: %s", d.Engine.Lease, LeaseSlack, want)
	}
	d, err = LoadDispatch(env(with(minimal, "OUTBOX_FUNCTION_TIMEOUT", "5m", "OUTBOX_LEASE", "7m", "OUTBOX_NAMESPACES", " a, ,b ")))
	if err != nil || d.Engine.Lease != 7*time.Minute || fmt.Sprint(d.Engine.Namespaces) != "[a b]" {
		t.Errorf("lease %s, namespaces %q, err %v", d.Engine.Lease, d.Engine.Namespaces, err)
	}
}

// A cold start reports every problem at once, one per line, each naming
// its variable: the logging, metrics, database, engine and routes.
func TestLoadDispatchReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	_, err := LoadDispatch(env(map[string]string{
		"OUTBOX_LOG_LEVEL":          "chatty",
		"OUTBOX_METRICS_NAMESPACE":  " ",
		"OUTBOX_DB_MAX_CONNS":       "0",
		"OUTBOX_BATCH_SIZE":         "0",
		"OUTBOX_SAFETY_MARGIN":      "soon",
		"OUTBOX_NAMESPACES":         "ok,not ok",
		"OUTBOX_ATTEMPT_CEILING":    "50",
		"OUTBOX_TARGET_CONCURRENCY": "257",
		"OUTBOX_ROUTES":             `{"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"eventbridge","event_bus":"default"},"retry":{"max_attempts":80}}]}`,
	}))
	if err == nil {
		t.Fatal("LoadDispatch succeeded")
	}
	for _, want := range []string{
		`logging: OUTBOX_LOG_LEVEL="chatty": want debug, info, warn or error`,
		"\nOUTBOX_BATCH_SIZE must be between 1 and 10000, got 0\n",
		"\nOUTBOX_SAFETY_MARGIN must be a Go duration such as 30s or 15m, got \"soon\"\n",
		"\nOUTBOX_NAMESPACES contains \"not ok\", which is not a namespace",
		"\nOUTBOX_TARGET_CONCURRENCY must be between 1 and 256, got 257\n",
		"pgconn: invalid database configuration: OUTBOX_DB_MAX_CONNS: must be from 1 to 100, got 0; no database configured",
		"\nroute: invalid configuration in OUTBOX_ROUTES (1 problem):\nroutes[0].retry.max_attempts: must be at most 50 (the database's attempt ceiling), got 80",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
	// The metrics namespace is reported as the registry's default is not:
	// a blank value counts as unset.
	if strings.Contains(err.Error(), "OUTBOX_METRICS_NAMESPACE") {
		t.Errorf("a blank OUTBOX_METRICS_NAMESPACE was reported:\n%v", err)
	}
}

// The engine's own check of the lease speaks of the variables.
func TestLoadDispatchLeaseShorterThanTheTimeout(t *testing.T) {
	t.Parallel()
	_, err := LoadDispatch(env(with(minimal, "OUTBOX_LEASE", "30s", "OUTBOX_FUNCTION_TIMEOUT", "60s")))
	want := "OUTBOX_LEASE (30s) must be longer than the function timeout (1m0s) plus OUTBOX_SAFETY_MARGIN (10s)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v, want %s", err, want)
	}
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

// outboxctl serve reads both configurations; a problem they share is
// reported once.
func TestLoadServe(t *testing.T) {
	t.Parallel()
	s, err := LoadServe(env(minimal), false)
	if err != nil || s.Reaper != nil || s.Dispatch.Routes == nil {
		t.Fatalf("serve without a reaper: %+v, %v", s, err)
	}
	s, err = LoadServe(env(with(minimal, "OUTBOX_REAPER_BATCH_SIZE", "20")), true)
	if err != nil || s.Reaper == nil || s.Reaper.BatchSize != 20 || s.Reaper.Database != s.Dispatch.Database {
		t.Fatalf("serve with a reaper: %+v, %v", s, err)
	}
	_, err = LoadServe(env(with(minimal, "OUTBOX_LOG_LEVEL", "chatty", "OUTBOX_REAPER_BATCH_SIZE", "0", "OUTBOX_BATCH_SIZE", "0")), true)
	if err == nil || strings.Count(err.Error(), "OUTBOX_LOG_LEVEL") != 1 ||
		!strings.Contains(err.Error(), "OUTBOX_REAPER_BATCH_SIZE") || !strings.Contains(err.Error(), "OUTBOX_BATCH_SIZE") {
		t.Errorf("err = %v, want the log level once, and both batch sizes", err)
	}
	// Without a reaper, its variables are not read.
	if _, err := LoadServe(env(with(minimal, "OUTBOX_REAPER_BATCH_SIZE", "0")), false); err != nil {
		t.Errorf("serve without a reaper: %v", err)
	}
}

// The routes come from OUTBOX_ROUTES or OUTBOX_ROUTES_FILE, and an error
// names the one used (and the file).
func TestLoadRoutes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "routes.json")
	yamlPath := filepath.Join(dir, "routes.yml")
	badPath := filepath.Join(dir, "bad.yaml")
	for path, src := range map[string]string{jsonPath: "../route/testdata/example.json", yamlPath: "../route/testdata/example.yaml"} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(badPath, []byte("routes:\n  - match: {namespace: a, topic: b}\n    target: {type: sqs}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	inline, err := os.ReadFile("../route/testdata/example.json")
	if err != nil {
		t.Fatal(err)
	}
	noFile := func(path string) ([]byte, error) { panic("readFile called for " + path) }
	load := func(vars map[string]string, readFile func(string) ([]byte, error)) (*route.Table, error) {
		e := env(vars)
		e.ReadFile = readFile
		return loadRoutes(e, route.Options{})
	}

	want, err := load(map[string]string{"OUTBOX_ROUTES": string(inline)}, noFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(want.Routes) != 4 || want.Match("payments", "charge").Target.Type != "sns" {
		t.Errorf("unexpected table: %d routes", len(want.Routes))
	}
	for _, path := range []string{jsonPath, yamlPath} {
		table, err := load(map[string]string{"OUTBOX_ROUTES_FILE": path}, os.ReadFile)
		if err != nil {
			t.Fatal(err)
		}
		if a, b := describeRoutes(table), describeRoutes(want); a != b {
			t.Errorf("%s's table differs from OUTBOX_ROUTES's:\n%s\n%s", path, a, b)
		}
	}

	_, err = load(map[string]string{"OUTBOX_ROUTES": string(inline), "OUTBOX_ROUTES_FILE": jsonPath}, noFile)
	if err == nil || err.Error() != "route: both OUTBOX_ROUTES and OUTBOX_ROUTES_FILE are set; set exactly one" {
		t.Errorf("both: err = %v, want one naming both variables", err)
	}

	_, err = load(map[string]string{"OUTBOX_ROUTE": "typo"}, noFile)
	if !errors.Is(err, ErrNoRoutes) || err.Error() != "route: no routes configured: set OUTBOX_ROUTES (the configuration as JSON) or OUTBOX_ROUTES_FILE (the path of a JSON or YAML file)" {
		t.Errorf("neither: err = %v, want ErrNoRoutes naming both variables", err)
	}

	missing := filepath.Join(dir, "missing.yaml")
	_, err = load(map[string]string{"OUTBOX_ROUTES_FILE": missing}, os.ReadFile)
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), `route: OUTBOX_ROUTES_FILE: reading "`+missing+`"`) {
		t.Errorf("unreadable file: err = %v", err)
	}

	_, err = load(map[string]string{"OUTBOX_ROUTES_FILE": badPath}, os.ReadFile)
	ce, ok := errors.AsType[*route.ConfigError](err)
	if !ok || len(ce.Problems) != 1 || ce.Problems[0].Field != "routes[0].target.type" {
		t.Fatalf("invalid file: err = %v, want a *route.ConfigError for routes[0].target.type", err)
	}
	if first, _, _ := strings.Cut(err.Error(), "\n"); first != `route: invalid configuration in OUTBOX_ROUTES_FILE "`+badPath+`" (1 problem):` {
		t.Errorf("invalid file: first line %q", first)
	}

	_, err = load(map[string]string{"OUTBOX_ROUTES": `{"routes": []}`}, noFile)
	if err == nil || err.Error() != "route: invalid configuration in OUTBOX_ROUTES (1 problem):\nroutes: is empty: list at least one route" {
		t.Errorf("invalid OUTBOX_ROUTES: err = %v", err)
	}
}

func describeRoutes(t *route.Table) string {
	var b strings.Builder
	for _, r := range t.Routes {
		fmt.Fprintf(&b, "%s %v %+v %+v %s %d\n", r.Name, r.Match, r.Target, r.Retry, r.Timeout, r.MaxPayloadBytes)
	}
	return b.String()
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
		cfg := tracingConfig(e.getenv(), newReader(e), lambdaRuntime(e.getenv()))
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
	if cfg.Source != pgconn.SourceURL || DatabaseURL(flagged) != "postgres://cli@db/x" || cfg.MaxConns != 16 || cfg.StatementTimeout != time.Minute {
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
