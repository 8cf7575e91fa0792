// Package settings is the registry of the OUTBOX_* environment variables —
// their defaults, limits and documentation, in one place — and a reader that
// parses them, collecting every problem with the variable's name so that a
// bad deployment fails its cold start with one complete message.
//
// The README's configuration reference is checked against Variables by a
// test, and another test fails when the code reads an OUTBOX_* variable that
// is not registered here: documentation cannot drift from code.
package settings

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
)

// Variable documents one environment variable.
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
}

// Variables is every OUTBOX_* variable, in reference order.
var Variables = []Variable{
	// Database (shared/pgconn): exactly one of the three sources.
	{"OUTBOX_DATABASE_URL", "", "PostgreSQL URL or key=value connection string (one of the three database sources).", "all"},
	{"OUTBOX_DB_SECRET_ARN", "", "Secrets Manager secret holding the RDS secret JSON (username, password, host, port, dbname); re-read once when a password was rotated.", "all"},
	{"OUTBOX_DB_IAM_AUTH", "false", "true: authenticate with RDS IAM tokens built per connection (needs OUTBOX_DB_HOST, OUTBOX_DB_NAME, OUTBOX_DB_USER).", "all"},
	{"OUTBOX_DB_HOST", "", "Database host for IAM authentication, or an override of the secret's host (e.g. an RDS Proxy endpoint).", "all"},
	{"OUTBOX_DB_PORT", "5432", "Database port for IAM authentication, or an override of the secret's port.", "all"},
	{"OUTBOX_DB_NAME", "", "Database name for IAM authentication, or an override of the secret's dbname.", "all"},
	{"OUTBOX_DB_USER", "", "Database user for IAM authentication.", "all"},
	{"OUTBOX_DB_SSLMODE", "", "libpq sslmode, overriding the URL's; require by default for the secret and IAM sources (IAM refuses anything weaker).", "all"},
	{"OUTBOX_DB_SSLROOTCERT", "", "CA bundle file for sslmode verify-ca or verify-full (the RDS bundle is not in the system trust store).", "all"},
	{"OUTBOX_DB_MAX_CONNS", "2", "Pool size per function instance (1-100); one invocation runs at a time.", "all"},
	{"OUTBOX_DB_SIMPLE_PROTOCOL", "false", "true behind RDS Proxy: no prepared statements, so sessions are not pinned.", "all"},
	{"OUTBOX_DB_STATEMENT_TIMEOUT", "30s", "statement_timeout set on every connection.", "all"},
	{"OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT", "10s", "idle_in_transaction_session_timeout set on every connection.", "all"},
	{"OUTBOX_DB_CONNECT_TIMEOUT", "5s", "Timeout for opening a connection.", "all"},

	// Routing (shared/route).
	{"OUTBOX_ROUTES", "", "The routes as JSON (see Routes); one of OUTBOX_ROUTES and OUTBOX_ROUTES_FILE is required.", "dispatch"},
	{"OUTBOX_ROUTES_FILE", "", "Path of a JSON or YAML routes file, instead of OUTBOX_ROUTES.", "dispatch"},

	// Dispatch (shared/dispatch).
	{"OUTBOX_BATCH_SIZE", "500", "Messages per claim (1-10000); an event's batch_size overrides it.", "dispatch"},
	{"OUTBOX_MAX_BATCHES", "10", "Claims per invocation (1-1000); an event's max_batches overrides it.", "dispatch"},
	{"OUTBOX_NAMESPACES", "", "Comma-separated namespaces this dispatcher claims (default all); an event's namespaces overrides it.", "dispatch"},
	{"OUTBOX_FUNCTION_TIMEOUT", "", "The function's timeout (the template sets it); the lease must exceed it plus the safety margin.", "dispatch"},
	{"OUTBOX_LEASE", "", "How long a claim holds its messages; default the function timeout plus the safety margin plus 1m, or 5m outside Lambda.", "dispatch"},
	{"OUTBOX_SAFETY_MARGIN", "10s", "No batch is claimed that would start publishing with less time than this left before the deadline.", "dispatch"},
	{"OUTBOX_TARGET_CONCURRENCY", "8", "Targets published to at once within a batch (each target also bounds its own calls).", "dispatch"},
	{"OUTBOX_ORDERED_RUN", "100", "Messages of one ordering key a claim hands out: the key's head and those queued behind it, delivered in order (1-10000).", "dispatch"},
	{"OUTBOX_BATCH_MAX_BYTES", "67108864", "Payload bytes one claim may load (at least 1048576): the memory budget per batch; two batches are in memory at once.", "dispatch"},
	{"OUTBOX_ATTEMPT_CEILING", strconv.Itoa(lease.DefaultAttemptCeiling), "Hard ceiling on attempts the database applies whatever a route says (1-100000); a route's retry.max_attempts may not exceed it.", "dispatch, reaper"},

	// Reaper.
	{"OUTBOX_REAPER_BATCH_SIZE", "1000", "Expired leases repaired per round (1-100000).", "reaper"},
	{"OUTBOX_REAPER_MAX_ROUNDS", "10", "Repair and purge rounds per invocation (1-1000).", "reaper"},
	{"OUTBOX_ATTEMPTS_RETENTION", "720h", "Archived attempts older than this are purged (0 keeps them; else at least 1h); history of pending and dead messages, and operators' actions, are kept.", "reaper"},
	{"OUTBOX_DEDUPE_RETENTION", "168h", "A dedupe key is forgotten this long after its message was delivered or discarded (0 keeps them; else at least 1h); keys of pending and dead messages are kept.", "reaper"},
	{"OUTBOX_KEY_RETENTION", "720h", "The bookkeeping of an ordering key with nothing pending or dead is forgotten after this long idle (0 keeps it); a key that comes back continues with higher sequence ids.", "reaper"},
	{"OUTBOX_PURGE_MAX_ROWS", "10000", "Rows purged per table per round (1-1000000).", "reaper"},

	// Dead-letter replay.
	{"OUTBOX_REPLAY_MAX_LIMIT", "1000", "Cap on an event's limit (1-10000).", "dlq-replay"},

	// Metrics.
	{"OUTBOX_METRICS_NAMESPACE", "Outbox", "CloudWatch namespace of every metric.", "all"},
	{"OUTBOX_METRICS_TOP_N", "20", "Namespace/topic pairs reported individually, by depth; the rest are aggregated (1-100).", "metrics"},

	// Logs and traces.
	{"OUTBOX_LOG_LEVEL", "info", "debug, info, warn or error (AWS_LAMBDA_LOG_LEVEL wins when set).", "all"},
	{"OUTBOX_TRACING", "auto", "auto traces with X-Ray inside Lambda when active tracing is on; off disables it; on forces it.", "all"},

	// The operator CLI (cmd/outboxctl).
	{"OUTBOX_SINK_SECRET", "", "Signing secret (whsec_… or base64) that outboxctl sink verifies deliveries with; a route's signing_secret_env may name it.", "outboxctl"},

	// The test harness (shared/pgtest).
	{"OUTBOX_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "Server the tests create their databases on; its user must create databases and roles.", "make test"},
	{"OUTBOX_TEST_KEEP_DATABASES", "", "Set to keep each test's database for inspection.", "make test"},
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

// Reader reads registered variables, applying their defaults and collecting
// every problem.
type Reader struct {
	getenv func(string) string
	errs   []error
}

// NewReader reads from getenv (os.Getenv in production).
func NewReader(getenv func(string) string) *Reader { return &Reader{getenv: getenv} }

// Err returns every problem met so far, one per line, or nil.
func (r *Reader) Err() error { return errors.Join(r.errs...) }

// Fail records a problem with a variable that the caller found.
func (r *Reader) Fail(name, format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("%s %s", name, fmt.Sprintf(format, args...)))
}

// Raw is the variable's value, or its default when unset.
func (r *Reader) Raw(name string) string {
	v, ok := Lookup(name)
	if !ok {
		panic("settings: " + name + " is not registered in settings.Variables")
	}
	if s := strings.TrimSpace(r.getenv(name)); s != "" {
		return s
	}
	return v.Default
}

// IsSet reports whether the variable has a non-empty value.
func (r *Reader) IsSet(name string) bool {
	if _, ok := Lookup(name); !ok {
		panic("settings: " + name + " is not registered in settings.Variables")
	}
	return strings.TrimSpace(r.getenv(name)) != ""
}

// String is the variable's value or default.
func (r *Reader) String(name string) string { return r.Raw(name) }

// Int parses an integer within [lo, hi].
func (r *Reader) Int(name string, lo, hi int) int {
	raw := r.Raw(name)
	if raw == "" {
		return 0
	}
	n, err := strconv.Atoi(raw)
	if err != nil {
		r.Fail(name, "must be a whole number, got %q", raw)
		return 0
	}
	if n < lo || n > hi {
		r.Fail(name, "must be between %d and %d, got %d", lo, hi, n)
	}
	return n
}

// Duration parses a Go duration ("90s", "15m") within [lo, hi].
func (r *Reader) Duration(name string, lo, hi time.Duration) time.Duration {
	raw := r.Raw(name)
	if raw == "" {
		return 0
	}
	d, err := time.ParseDuration(raw)
	if err != nil {
		r.Fail(name, "must be a Go duration such as 30s or 15m, got %q", raw)
		return 0
	}
	if d < lo || d > hi {
		r.Fail(name, "must be between %s and %s, got %s", lo, hi, d)
	}
	return d
}

// Bool parses true/false/1/0.
func (r *Reader) Bool(name string) bool {
	switch raw := strings.ToLower(r.Raw(name)); raw {
	case "", "false", "0":
		return false
	case "true", "1":
		return true
	default:
		r.Fail(name, "must be true or false, got %q", raw)
		return false
	}
}

// List splits a comma-separated value, dropping empty items.
func (r *Reader) List(name string) []string {
	var out []string
	for _, item := range strings.Split(r.Raw(name), ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// OneOf checks the value is one of the allowed words.
func (r *Reader) OneOf(name string, allowed ...string) string {
	raw := strings.ToLower(r.Raw(name))
	for _, a := range allowed {
		if raw == a {
			return raw
		}
	}
	r.Fail(name, "must be one of %s, got %q", strings.Join(allowed, ", "), raw)
	return ""
}

// MarkdownReference renders Variables as the Markdown table the README
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
