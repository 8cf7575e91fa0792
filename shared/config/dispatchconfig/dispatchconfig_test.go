package dispatchconfig

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

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/route"
)

// env is an Env over a map.
func env(vars map[string]string) config.Env {
	return config.Env{Getenv: func(name string) string { return vars[name] }}
}

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

const goodRoutes = `{"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"http","url":"https://x.example/","signing_secret_env":"HOOK_SECRET"}}]}`

var minimal = map[string]string{"OUTBOX_DATABASE_URL": "postgres://app@db/outbox", "OUTBOX_ROUTES": goodRoutes}

func TestLoadDefaults(t *testing.T) {
	t.Parallel()
	d, err := Load(env(with(minimal, "HOOK_SECRET", "whsec_x")))
	if err != nil {
		t.Fatal(err)
	}
	e := d.Engine
	if e.BatchSize != config.DefaultBatchSize || e.MaxBatches != config.DefaultMaxBatches || e.SafetyMargin != config.DefaultSafetyMargin ||
		e.TargetConcurrency != config.DefaultTargetConcurrency || e.OrderedRun != config.DefaultOrderedRun || e.BatchBytes != config.DefaultBatchBytes ||
		e.Lease != config.DefaultLease || e.FunctionTimeout != 0 || e.Namespaces != nil || e.Names != engineNames {
		t.Errorf("engine %+v, want the defaults", e)
	}
	if d.AttemptCeiling != outboxtype.DefaultAttemptCeiling || len(d.Routes.Routes) != 1 {
		t.Errorf("ceiling %d, %d routes", d.AttemptCeiling, len(d.Routes.Routes))
	}
	if d.SigningSecrets["HOOK_SECRET"] != "whsec_x" || len(d.SigningSecrets) != 1 {
		t.Errorf("signing secrets %v, want the one the route names", d.SigningSecrets)
	}
	if d.LogLevel != slog.LevelInfo || d.MetricsNamespace != config.DefaultMetricsNamespace || d.Database.Source != dbpool.SourceURL || d.Tracing.Enabled {
		t.Errorf("function %+v", d.Function)
	}
}

// The lease no longer follows the function timeout: under Lambda each
// claim's lease is the invocation's time left plus the safety margin, and
// OUTBOX_LEASE is the lease of runs without a deadline.
// Behind a transaction pooler a lingering invocation polls: OUTBOX_LISTEN
// is off unless set, and set on it is refused, since the pooler would leave
// the LISTEN on a server connection nobody reads.
func TestLoadBehindATransactionPoolerPolls(t *testing.T) {
	t.Parallel()
	base := with(minimal, "HOOK_SECRET", "whsec_x", "OUTBOX_LINGER", "on")
	d, err := Load(env(base))
	if err != nil || !d.Linger.Listen {
		t.Fatalf("without a pooler: listen %t, %v; want on by default", d.Linger.Listen, err)
	}
	d, err = Load(env(with(base, "OUTBOX_DB_POOLER", "transaction")))
	if err != nil || d.Linger.Listen || !d.Linger.Enabled || !d.Database.SimpleProtocol {
		t.Fatalf("OUTBOX_DB_POOLER=transaction: linger %+v, simple protocol %t, %v; want polling", d.Linger, d.Database.SimpleProtocol, err)
	}
	if _, err := Load(env(with(base, "OUTBOX_DB_POOLER", "transaction", "OUTBOX_LISTEN", "off"))); err != nil {
		t.Errorf("OUTBOX_LISTEN=off behind a transaction pooler: %v", err)
	}
	_, err = Load(env(with(base, "OUTBOX_DB_POOLER", "transaction", "OUTBOX_LISTEN", "on")))
	if err == nil || !strings.Contains(err.Error(), "OUTBOX_LISTEN is on, but a transaction pooler (OUTBOX_DB_POOLER=transaction) cannot keep a LISTEN") {
		t.Errorf("OUTBOX_LISTEN=on behind a transaction pooler: %v", err)
	}
}

func TestLoadLease(t *testing.T) {
	t.Parallel()
	d, err := Load(env(with(minimal, "OUTBOX_FUNCTION_TIMEOUT", "5m", "OUTBOX_SAFETY_MARGIN", "20s")))
	if err != nil {
		t.Fatal(err)
	}
	if d.Engine.Lease != config.DefaultLease || d.Engine.FunctionTimeout != 5*time.Minute {
		t.Errorf("lease %s, timeout %s: want the default lease whatever the timeout", d.Engine.Lease, d.Engine.FunctionTimeout)
	}
	d, err = Load(env(with(minimal, "OUTBOX_FUNCTION_TIMEOUT", "5m", "OUTBOX_LEASE", "7m", "OUTBOX_NAMESPACES", " a, ,b ")))
	if err != nil || d.Engine.Lease != 7*time.Minute || fmt.Sprint(d.Engine.Namespaces) != "[a b]" {
		t.Errorf("lease %s, namespaces %q, err %v", d.Engine.Lease, d.Engine.Namespaces, err)
	}
}

// A cold start reports every problem at once, one per line, each naming
// its variable: the logging, metrics, database, engine and routes.
func TestLoadReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	_, err := Load(env(map[string]string{
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
		t.Fatal("Load succeeded")
	}
	for _, want := range []string{
		`logging: OUTBOX_LOG_LEVEL="chatty": want debug, info, warn or error`,
		"\nOUTBOX_BATCH_SIZE must be between 1 and 10000, got 0\n",
		"\nOUTBOX_SAFETY_MARGIN must be a Go duration such as 30s or 15m, got \"soon\"\n",
		"\nOUTBOX_NAMESPACES contains \"not ok\", which is not a namespace",
		"\nOUTBOX_TARGET_CONCURRENCY must be between 1 and 256, got 257\n",
		"dbpool: invalid database configuration: OUTBOX_DB_MAX_CONNS: must be from 1 to 100, got 0; no database configured",
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
func TestLoadLeaseInsideTheSafetyMargin(t *testing.T) {
	t.Parallel()
	_, err := Load(env(with(minimal, "OUTBOX_LEASE", "5s", "OUTBOX_SAFETY_MARGIN", "10s")))
	want := "OUTBOX_LEASE (5s) must be longer than OUTBOX_SAFETY_MARGIN (10s)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v, want %s", err, want)
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

// The routes come from OUTBOX_ROUTES, OUTBOX_ROUTES_FILE or
// OUTBOX_ROUTES_SSM_PARAMETER, and an error names the one used (and the
// file or parameter).
func TestLoadRoutes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "routes.json")
	yamlPath := filepath.Join(dir, "routes.yml")
	badPath := filepath.Join(dir, "bad.yaml")
	for path, src := range map[string]string{jsonPath: "../../route/testdata/example.json", yamlPath: "../../route/testdata/example.yaml"} {
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
	inline, err := os.ReadFile("../../route/testdata/example.json")
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
	if err == nil || err.Error() != "route: OUTBOX_ROUTES and OUTBOX_ROUTES_FILE are set; set exactly one" {
		t.Errorf("both: err = %v, want one naming both variables", err)
	}
	_, err = load(map[string]string{"OUTBOX_ROUTES_FILE": jsonPath, "OUTBOX_ROUTES_SSM_PARAMETER": "/outbox/routes"}, noFile)
	if err == nil || err.Error() != "route: OUTBOX_ROUTES_FILE and OUTBOX_ROUTES_SSM_PARAMETER are set; set exactly one" {
		t.Errorf("file and parameter: err = %v, want one naming both variables", err)
	}

	_, err = load(map[string]string{"OUTBOX_ROUTE": "typo"}, noFile)
	if !errors.Is(err, ErrNoRoutes) || err.Error() != "route: no routes configured: set OUTBOX_ROUTES (the configuration as JSON), OUTBOX_ROUTES_FILE (the path of a JSON or YAML file) or OUTBOX_ROUTES_SSM_PARAMETER (an SSM parameter holding it)" {
		t.Errorf("none: err = %v, want ErrNoRoutes naming the three variables", err)
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

// OUTBOX_ROUTES_SSM_PARAMETER's value is read through Env.ReadParameter
// (package ssmparam's reader in the function) and decoded as the other
// sources are; an error names the parameter.
func TestLoadRoutesFromAParameter(t *testing.T) {
	t.Parallel()
	yamlRoutes, err := os.ReadFile("../../route/testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	jsonRoutes, err := os.ReadFile("../../route/testdata/example.json")
	if err != nil {
		t.Fatal(err)
	}
	parameters := map[string]string{
		"/outbox/routes": string(yamlRoutes),
		"/outbox/bad":    `{"routes": []}`,
	}
	var reads []string
	e := env(map[string]string{"OUTBOX_ROUTES_SSM_PARAMETER": "/outbox/routes"})
	e.ReadParameter = func(name string) (string, error) {
		reads = append(reads, name)
		v, ok := parameters[name]
		if !ok {
			return "", fmt.Errorf("ParameterNotFound: %s", name)
		}
		return v, nil
	}
	table, err := loadRoutes(e, route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := loadRoutes(env(map[string]string{"OUTBOX_ROUTES": string(jsonRoutes)}), route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := describeRoutes(table), describeRoutes(want); a != b {
		t.Errorf("the parameter's table differs from OUTBOX_ROUTES's:\n%s\n%s", a, b)
	}
	if len(reads) != 1 {
		t.Errorf("the parameter was read %d times, want once", len(reads))
	}

	bad := e
	bad.Getenv = env(map[string]string{"OUTBOX_ROUTES_SSM_PARAMETER": "/outbox/bad"}).Getenv
	_, err = loadRoutes(bad, route.Options{})
	if first, _, _ := strings.Cut(fmt.Sprint(err), "\n"); first != `route: invalid configuration in OUTBOX_ROUTES_SSM_PARAMETER "/outbox/bad" (1 problem):` {
		t.Errorf("invalid parameter: %v", err)
	}
	missing := e
	missing.Getenv = env(map[string]string{"OUTBOX_ROUTES_SSM_PARAMETER": "/outbox/nope"}).Getenv
	if _, err = loadRoutes(missing, route.Options{}); err == nil || err.Error() != `route: OUTBOX_ROUTES_SSM_PARAMETER: reading "/outbox/nope": ParameterNotFound: /outbox/nope` {
		t.Errorf("missing parameter: %v", err)
	}
	// A process that cannot read parameters says so rather than
	// pretending there are no routes.
	if _, err = loadRoutes(env(map[string]string{"OUTBOX_ROUTES_SSM_PARAMETER": "/outbox/routes"}), route.Options{}); err == nil ||
		!strings.Contains(err.Error(), "nothing reads SSM parameters in this process") {
		t.Errorf("no parameter reader: %v", err)
	}
}
