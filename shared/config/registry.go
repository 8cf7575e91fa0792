package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// Variable documents one environment variable and bounds its value.
type Variable struct {
	Name string
	// Default is the value used when the variable is unset ("" when there
	// is none).
	Default string
	// Usage is one sentence for the reference.
	Usage string
	// Functions lists who reads it: dispatch, reaper, dlq-replay, metrics,
	// outboxctl, or "all".
	Functions string

	// min and max bound a number (or a duration, in nanoseconds); the
	// reader enforces them and Usage quotes them.
	min, max int64
}

// The dispatch engine's defaults and limits, which shared/dispatch applies
// and checks too. They are declared here, not there, because this package
// must not import shared/dispatch: that would link the routes' JSON Schema
// library, and its package initialisation, into every function.
const (
	DefaultBatchSize         = 500
	DefaultMaxBatches        = 10
	DefaultLease             = 5 * time.Minute
	DefaultSafetyMargin      = 10 * time.Second
	DefaultTargetConcurrency = 8
	DefaultOrderedRun        = 100
	DefaultBatchBytes        = 64 << 20
	// DefaultPollInterval is how often a lingering invocation claims
	// when it cannot LISTEN; ListeningPollInterval how often it claims
	// anyway while it listens (a safety net for lost notifications and
	// retries becoming due, which notify nobody). An idle deployment's
	// claims per second are one or two lingering invocations' polls.
	DefaultPollInterval   = 250 * time.Millisecond
	ListeningPollInterval = 5 * time.Second
	// DefaultMaxWorkers is one: no fan-out unless the deployment allows
	// it (the template sets DispatchMaxWorkers).
	DefaultMaxWorkers = 1
	// DefaultFanoutGenerations: only an invocation started by the
	// schedule (generation 0) starts workers.
	DefaultFanoutGenerations = 1
	// DefaultFanoutDrainWithin is how soon fan-out means to drain a
	// backlog.
	DefaultFanoutDrainWithin = 30 * time.Second
	// MaxBatchSize is the most messages outbox.claim_batch takes at once.
	MaxBatchSize = 10_000
	// MaxMaxBatches bounds the claims of one run.
	MaxMaxBatches = 1000
	// MinBatchBytes is the smallest payload budget of a claim.
	MinBatchBytes = 1 << 20
)

// Limits of the variables that are not a component's own: the range an
// operator may set, where the component would accept more.
const (
	// MaxAttemptCeiling caps OUTBOX_ATTEMPT_CEILING.
	MaxAttemptCeiling = 100_000
	// MaxFunctionTimeout is Lambda's longest timeout.
	MaxFunctionTimeout = 15 * time.Minute
	// MaxSafetyMargin caps OUTBOX_SAFETY_MARGIN.
	MaxSafetyMargin = 10 * time.Minute
	// MaxTargetConcurrency caps OUTBOX_TARGET_CONCURRENCY.
	MaxTargetConcurrency = 256
	// MaxBatchBytes caps OUTBOX_BATCH_MAX_BYTES.
	MaxBatchBytes = 1 << 40
	// MinPollInterval and MaxPollInterval bound OUTBOX_POLL_INTERVAL.
	MinPollInterval = 10 * time.Millisecond
	MaxPollInterval = time.Minute
	// MaxMaxWorkers caps OUTBOX_MAX_WORKERS: Lambda's default account
	// concurrency.
	MaxMaxWorkers = 1000
	// MaxFanoutGenerations caps OUTBOX_FANOUT_GENERATIONS.
	MaxFanoutGenerations = 10
	// MaxLease caps OUTBOX_LEASE.
	MaxLease = 24 * time.Hour

	// MaxReaperBatchSize is the most expired leases one
	// outbox.repair_expired_leases call repairs, and so the cap of
	// OUTBOX_REAPER_BATCH_SIZE and of a reaper event's batch_size.
	MaxReaperBatchSize = 100_000
	// MaxReaperRounds caps OUTBOX_REAPER_MAX_ROUNDS and a reaper event's
	// max_rounds.
	MaxReaperRounds = 1000
	// MinRetention is the shortest retention other than 0 (keep).
	MinRetention = time.Hour
	// MaxRetention caps the retentions: a century is forever.
	MaxRetention = 100 * 365 * 24 * time.Hour
	// MaxPurgeRows is the most rows one outbox.purge call deletes per
	// table.
	MaxPurgeRows = 1_000_000
	// MaxReplayLimit is the most dead letters one outbox.replay_dead call
	// takes, and so the cap of OUTBOX_REPLAY_MAX_LIMIT.
	MaxReplayLimit = 10_000
	// MaxMetricsTopN caps OUTBOX_METRICS_TOP_N.
	MaxMetricsTopN = 100
)

// Defaults of the variables that are not a component's own.
const (
	DefaultReaperBatchSize   = 1000
	DefaultReaperRounds      = 10
	DefaultAttemptsRetention = 30 * 24 * time.Hour
	DefaultDedupeRetention   = 7 * 24 * time.Hour
	DefaultKeyRetention      = 30 * 24 * time.Hour
	DefaultPurgeRows         = 10_000
	DefaultReplayMaxLimit    = 1000
	// DefaultMetricsNamespace is the CloudWatch namespace of every metric.
	DefaultMetricsNamespace = "Outbox"
	DefaultMetricsTopN      = 20
)

// Variables is every OUTBOX_* variable, in reference order. Every default
// and limit is a constant of the component it configures, or of this
// package when the component has none.
var Variables = []Variable{
	// Database (shared/dbpool): exactly one of the three sources.
	text("OUTBOX_DATABASE_URL", "", "all", "PostgreSQL URL or key=value connection string (one of the three database sources)."),
	text("OUTBOX_DB_SECRET_ARN", "", "all", "Secrets Manager secret holding the RDS secret JSON (username, password, host, port, dbname); re-read once when a password was rotated."),
	text("OUTBOX_DB_IAM_AUTH", "false", "all", "true: authenticate with RDS IAM tokens built per connection (needs OUTBOX_DB_HOST, OUTBOX_DB_NAME, OUTBOX_DB_USER)."),
	text("OUTBOX_DB_HOST", "", "all", "Database host for IAM authentication, or an override of the secret's host (e.g. an RDS Proxy endpoint)."),
	count("OUTBOX_DB_PORT", dbpool.DefaultPort, 1, 65535, "all", "Database port for IAM authentication, or an override of the secret's port."),
	text("OUTBOX_DB_NAME", "", "all", "Database name for IAM authentication, or an override of the secret's dbname."),
	text("OUTBOX_DB_USER", "", "all", "Database user for IAM authentication."),
	text("OUTBOX_DB_SSLMODE", "", "all", "libpq sslmode, overriding the URL's; "+dbpool.DefaultSSLMode+" by default for the secret and IAM sources (IAM refuses anything weaker)."),
	text("OUTBOX_DB_SSLROOTCERT", "", "all", "CA bundle file for sslmode verify-ca or verify-full (the RDS bundle is not in the system trust store)."),
	count("OUTBOX_DB_MAX_CONNS", dbpool.DefaultMaxConns, 1, dbpool.MaxMaxConns, "all", "Pool size per function instance ({min}-{max}); one invocation runs at a time."),
	text("OUTBOX_DB_POOLER", string(dbpool.PoolerNone), "all", "transaction behind a pooler in transaction mode (PgBouncer pool_mode = transaction, Supavisor, RDS Proxy): implies OUTBOX_DB_SIMPLE_PROTOCOL=true and OUTBOX_LISTEN=off, and sets the timeouts in each transaction rather than as startup parameters, which PgBouncer refuses. none: PostgreSQL itself. Migrations always need none."),
	text("OUTBOX_DB_SIMPLE_PROTOCOL", "false", "all", "true: no prepared statements, so RDS Proxy does not pin sessions (implied by OUTBOX_DB_POOLER=transaction)."),
	duration("OUTBOX_DB_STATEMENT_TIMEOUT", dbpool.DefaultStatementTimeout, dbpool.MinTimeout, dbpool.MaxSessionTimeout, "all", "statement_timeout of every statement: a startup parameter of each connection, or with OUTBOX_DB_POOLER=transaction SET LOCAL in each transaction."),
	duration("OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT", dbpool.DefaultIdleInTransactionTimeout, dbpool.MinTimeout, dbpool.MaxSessionTimeout, "all", "idle_in_transaction_session_timeout, set as OUTBOX_DB_STATEMENT_TIMEOUT is."),
	duration("OUTBOX_DB_CONNECT_TIMEOUT", dbpool.DefaultConnectTimeout, dbpool.MinTimeout, dbpool.MaxConnectTimeout, "all", "Timeout for opening a connection."),

	// Routing (shared/route).
	text("OUTBOX_ROUTES", "", "dispatch", "The routes as JSON (see Routes); exactly one of OUTBOX_ROUTES, OUTBOX_ROUTES_FILE and OUTBOX_ROUTES_SSM_PARAMETER is required."),
	text("OUTBOX_ROUTES_FILE", "", "dispatch", "Path of a JSON or YAML routes file, e.g. /var/task/routes.json shipped next to bootstrap by sam build: routes beyond Lambda's 4 KB environment."),
	text("OUTBOX_ROUTES_SSM_PARAMETER", "", "dispatch", "Name or ARN of an SSM parameter (String or SecureString, up to 8 KB as an advanced parameter) holding the routes as JSON or YAML, read once per cold start."),

	// Dispatch (shared/dispatch).
	count("OUTBOX_BATCH_SIZE", DefaultBatchSize, 1, MaxBatchSize, "dispatch", "Messages per claim ({min}-{max}); an event's batch_size overrides it."),
	count("OUTBOX_MAX_BATCHES", DefaultMaxBatches, 1, MaxMaxBatches, "dispatch", "Claims per invocation ({min}-{max}); an event's max_batches overrides it."),
	text("OUTBOX_NAMESPACES", "", "dispatch", "Comma-separated namespaces this dispatcher claims (default all); an event's namespaces overrides it."),
	duration("OUTBOX_FUNCTION_TIMEOUT", 0, time.Second, MaxFunctionTimeout, "dispatch", "The function's timeout (the template sets it): how much one invocation can deliver, which sizes fan-out."),
	duration("OUTBOX_LEASE", DefaultLease, time.Second, MaxLease, "dispatch", "How long a claim holds its messages when the run has no deadline (outboxctl serve); under Lambda each claim's lease is the invocation's time left plus the safety margin."),
	duration("OUTBOX_SAFETY_MARGIN", DefaultSafetyMargin, time.Second, MaxSafetyMargin, "dispatch", "No batch is claimed that would start publishing with less time than this left before the deadline."),
	count("OUTBOX_TARGET_CONCURRENCY", DefaultTargetConcurrency, 1, MaxTargetConcurrency, "dispatch", "Targets published to at once within a batch (each target also bounds its own calls)."),
	count("OUTBOX_ORDERED_RUN", DefaultOrderedRun, 1, MaxBatchSize, "dispatch", "Messages of one ordering key a claim hands out: the key's head and those queued behind it, delivered in order ({min}-{max}). A key alone in the queue gets longer runs (doubling, up to the batch size) while a run publishes in under a second."),
	count("OUTBOX_BATCH_MAX_BYTES", DefaultBatchBytes, MinBatchBytes, MaxBatchBytes, "dispatch", "Payload bytes one claim may load (at least {min}): the memory budget per batch; two batches are in memory at once."),
	text("OUTBOX_LINGER", "off", "dispatch", "on: after draining, an invocation waits for new work until its deadline less the safety margin, woken by LISTEN/NOTIFY or polling; off (or 0) returns at once (the template turns it on)."),
	text("OUTBOX_LISTEN", "on", "dispatch", "on: a lingering invocation LISTENs on a connection of its own (claiming anyway every "+shortDuration(ListeningPollInterval)+"); off polls every OUTBOX_POLL_INTERVAL. Off by default with OUTBOX_DB_POOLER=transaction, where it cannot be on (a transaction pooler cannot keep a LISTEN)."),
	duration("OUTBOX_POLL_INTERVAL", DefaultPollInterval, MinPollInterval, MaxPollInterval, "dispatch", "How often a lingering invocation claims when it does not listen."),
	count("OUTBOX_MAX_WORKERS", DefaultMaxWorkers, 1, MaxMaxWorkers, "dispatch", "Most dispatch invocations a backlog may run at once ({min}-{max}): a run with more backlog than time starts up to this many less one by asynchronous self-invocation; 1 starts none. Set it to the function's reserved concurrency."),
	duration("OUTBOX_FANOUT_DRAIN_WITHIN", DefaultFanoutDrainWithin, time.Second, MaxFunctionTimeout, "dispatch", "Fan-out sizes the fleet to drain the backlog within this, at the rate the deciding invocation measured (or before the deadline, when that comes first)."),
	count("OUTBOX_FANOUT_GENERATIONS", DefaultFanoutGenerations, 1, MaxFanoutGenerations, "dispatch", "How many generations of fan-out a chain may have ({min}-{max}): an invocation of this generation starts no more, so that a fan-out can never loop."),
	count("OUTBOX_ATTEMPT_CEILING", outboxtype.DefaultAttemptCeiling, 1, MaxAttemptCeiling, "dispatch, reaper", "Hard ceiling on attempts the database applies whatever a route says ({min}-{max}); a route's retry.max_attempts may not exceed it."),

	// Reaper.
	count("OUTBOX_REAPER_BATCH_SIZE", DefaultReaperBatchSize, 1, MaxReaperBatchSize, "reaper", "Expired leases repaired per round ({min}-{max})."),
	count("OUTBOX_REAPER_MAX_ROUNDS", DefaultReaperRounds, 1, MaxReaperRounds, "reaper", "Repair and purge rounds per invocation ({min}-{max})."),
	duration("OUTBOX_ATTEMPTS_RETENTION", DefaultAttemptsRetention, 0, MaxRetention, "reaper", "Archived attempts older than this are purged (0 keeps them; else at least "+shortDuration(MinRetention)+"); history of pending and dead messages, and operators' actions, are kept. From a day up, the archive goes a day at a time (a partition dropped once its whole day is past): a row may outlive this by up to a day."),
	duration("OUTBOX_DEDUPE_RETENTION", DefaultDedupeRetention, 0, MaxRetention, "reaper", "A dedupe key is forgotten this long after its message was delivered or discarded (0 keeps them; else at least "+shortDuration(MinRetention)+"); keys of pending and dead messages are kept."),
	duration("OUTBOX_KEY_RETENTION", DefaultKeyRetention, 0, MaxRetention, "reaper", "The bookkeeping of an ordering key with nothing pending or dead is forgotten after this long idle (0 keeps it); a key that comes back continues with higher sequence ids."),
	count("OUTBOX_PURGE_MAX_ROWS", DefaultPurgeRows, 1, MaxPurgeRows, "reaper", "Rows purged per table per round ({min}-{max})."),

	// Dead-letter replay.
	count("OUTBOX_REPLAY_MAX_LIMIT", DefaultReplayMaxLimit, 1, MaxReplayLimit, "dlq-replay", "Cap on an event's limit ({min}-{max})."),

	// Metrics.
	text("OUTBOX_METRICS_NAMESPACE", DefaultMetricsNamespace, "all", "CloudWatch namespace of every metric."),
	count("OUTBOX_METRICS_TOP_N", DefaultMetricsTopN, 1, MaxMetricsTopN, "metrics", "Namespace/topic pairs reported individually, by depth; the rest are aggregated ({min}-{max})."),

	// Logs and traces.
	text("OUTBOX_LOG_LEVEL", "info", "all", "debug, info, warn or error (AWS_LAMBDA_LOG_LEVEL wins when set)."),
	text("OUTBOX_TRACING", "auto", "all", "auto traces with X-Ray inside Lambda when active tracing is on; off disables it; on forces it."),

	// The operator CLI (cmd/outboxctl).
	text(SinkSecretVariable, "", "outboxctl", "Signing secret (whsec_… or base64) that outboxctl sink verifies deliveries with; a route's signing_secret_env may name it."),

	// The test harness: read by shared/testkit/pgtest alone, never by the product.
	text("OUTBOX_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "make test", "Server the tests create their databases on; its user must create databases and roles."),
	text("OUTBOX_TEST_KEEP_DATABASES", "", "make test", "Set to keep each test's database for inspection."),
}

// text registers a string, boolean or list variable.
func text(name, def, functions, usage string) Variable {
	return Variable{Name: name, Default: def, Usage: usage, Functions: functions}
}

// count registers an integer variable within [lo, hi]; {min} and {max} in
// usage stand for the bounds.
func count[N int | int64](name string, def, lo, hi N, functions, usage string) Variable {
	r := strings.NewReplacer("{min}", strconv.FormatInt(int64(lo), 10), "{max}", strconv.FormatInt(int64(hi), 10))
	return Variable{Name: name, Default: strconv.FormatInt(int64(def), 10), Usage: r.Replace(usage), Functions: functions,
		min: int64(lo), max: int64(hi)}
}

// duration registers a duration variable within [lo, hi]; a zero def means
// no default.
func duration(name string, def, lo, hi time.Duration, functions, usage string) Variable {
	v := Variable{Name: name, Usage: usage, Functions: functions, min: int64(lo), max: int64(hi)}
	if def != 0 {
		v.Default = shortDuration(def)
	}
	return v
}

// shortDuration writes d as an operator would: 720h, 30s, 1m30s — not
// 720h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// Lookup returns the registered variable name.
func Lookup(name string) (Variable, bool) {
	for _, v := range Variables {
		if v.Name == name {
			return v, true
		}
	}
	return Variable{}, false
}

// mustLookup is Lookup for the names this package reads: an unregistered
// one is a bug that the first test to load a configuration finds.
func mustLookup(name string) Variable {
	v, ok := Lookup(name)
	if !ok {
		panic("config: " + name + " is not registered in config.Variables")
	}
	return v
}

// MarkdownReference renders Variables as the Markdown table docs/CONFIGURATION.md
// carries; a test keeps the two equal.
func MarkdownReference() string {
	var b strings.Builder
	b.WriteString("| variable | default | read by | meaning |\n")
	b.WriteString("|---|---|---|---|\n")
	for _, v := range Variables {
		def := "—"
		if v.Default != "" {
			def = "`" + v.Default + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", v.Name, def, v.Functions, strings.ReplaceAll(v.Usage, "|", `\|`))
	}
	return b.String()
}
