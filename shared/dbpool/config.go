package dbpool

import (
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/arn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/configerr"
)

// Names are what the operator calls the settings that messages point at:
// a validation problem names its setting, a failed Open its source. The
// config package, which builds a Config from the environment, names them
// after their environment variables; a zero field is the Config field's Go
// name.
type Names struct {
	DatabaseURL string
	SecretARN   string
	// IAM names the choice of SourceIAM (an environment says
	// OUTBOX_DB_IAM_AUTH=true; the default is "Source=iam").
	IAM                      string
	Host                     string
	Port                     string
	Database                 string
	User                     string
	SSLMode                  string
	SSLRootCert              string
	MaxConns                 string
	Pooler                   string
	StatementTimeout         string
	IdleInTransactionTimeout string
	ConnectTimeout           string
}

func (n Names) withDefaults() Names {
	for _, f := range []struct {
		name *string
		def  string
	}{
		{&n.DatabaseURL, "DatabaseURL"}, {&n.SecretARN, "SecretARN"}, {&n.IAM, "Source=" + string(SourceIAM)},
		{&n.Host, "Host"}, {&n.Port, "Port"}, {&n.Database, "Database"}, {&n.User, "User"},
		{&n.SSLMode, "SSLMode"}, {&n.SSLRootCert, "SSLRootCert"}, {&n.MaxConns, "MaxConns"},
		{&n.Pooler, "Pooler"},
		{&n.StatementTimeout, "StatementTimeout"}, {&n.IdleInTransactionTimeout, "IdleInTransactionTimeout"},
		{&n.ConnectTimeout, "ConnectTimeout"},
	} {
		if *f.name == "" {
			*f.name = f.def
		}
	}
	return n
}

// Defaults for the optional settings; a zero field in Config takes these.
const (
	// DefaultMaxConns is two: a Lambda execution environment runs one
	// invocation at a time, and one spare connection lets a caller hold a
	// transaction while something else (a ping, a stats read) runs.
	DefaultMaxConns                 = 2
	DefaultPort                     = 5432
	DefaultStatementTimeout         = 30 * time.Second
	DefaultIdleInTransactionTimeout = 10 * time.Second
	DefaultConnectTimeout           = 5 * time.Second
	// DefaultApplicationName is the application_name when Deps names none.
	DefaultApplicationName = "outbox-dispatcher"
	// DefaultSSLMode applies to the Secrets Manager and IAM sources, which
	// send a password or token over the network; a URL carries its own
	// sslmode.
	DefaultSSLMode = "require"
)

// Limits on the settings.
const (
	// MaxMaxConns caps MaxConns: every Lambda execution
	// environment holds its own pool, so the server sees this times the
	// function's concurrency.
	MaxMaxConns = 100
	// MinTimeout is the smallest timeout: the server counts milliseconds,
	// and 0 would mean no timeout at all.
	MinTimeout = time.Millisecond
	// MaxSessionTimeout caps the statement and idle-in-transaction
	// timeouts.
	MaxSessionTimeout = 24 * time.Hour
	// MaxConnectTimeout caps ConnectTimeout.
	MaxConnectTimeout = 5 * time.Minute
)

// Source is where the database credentials come from.
type Source string

// The database sources; a Config has exactly one.
const (
	// SourceURL connects with a connection string (DatabaseURL).
	SourceURL Source = "url"
	// SourceSecretsManager reads an RDS secret from Secrets Manager
	// (SecretARN), and reads it again when the database rejects the
	// password, so that a rotation heals without a restart.
	SourceSecretsManager Source = "secretsmanager"
	// SourceIAM authenticates with a fresh RDS IAM auth token per connection
	// (Host, Port, Database, User).
	SourceIAM Source = "iam"
)

// Pooler is what kind of connection pooler, if any, stands between the
// pool and PostgreSQL.
type Pooler string

// The poolers a Config may name.
const (
	// PoolerNone: the server itself, or a pooler that keeps a client's
	// session state (RDS Proxy pins a session that changes it). The
	// timeouts are startup parameters of each connection.
	PoolerNone Pooler = "none"
	// PoolerTransaction: a pooler in transaction mode (PgBouncer's
	// pool_mode = transaction, Supavisor's transaction port), which may
	// hand each transaction of a session to another server connection.
	// Nothing may be left in the session: every query goes with the simple
	// protocol (no prepared statements), the timeouts travel with each
	// transaction (see Pool), and nothing LISTENs.
	PoolerTransaction Pooler = "transaction"
)

var poolers = []string{string(PoolerNone), string(PoolerTransaction)}

// ConnString is a PostgreSQL connection string (a URL or key=value pairs)
// that may hold a password. It prints, marshals and logs redacted; only an
// explicit string(cs) conversion reveals it.
type ConnString string

// String is the connection string with any password replaced by xxxxx.
func (cs ConnString) String() string { return Redact(string(cs)) }

// GoString is String quoted, so that %#v never shows the password.
func (cs ConnString) GoString() string { return strconv.Quote(cs.String()) }

// MarshalText marshals the redacted form: a ConnString written to JSON or
// YAML does not carry the password.
func (cs ConnString) MarshalText() ([]byte, error) { return []byte(cs.String()), nil }

// LogValue logs the redacted form.
func (cs ConnString) LogValue() slog.Value { return slog.StringValue(cs.String()) }

// Config is the validated database configuration. It holds no secret but
// the password a DatabaseURL may contain, and that prints redacted.
type Config struct {
	// Source says which of the fields below name the database.
	Source Source

	// DatabaseURL is the connection string (SourceURL).
	DatabaseURL ConnString

	// SecretARN is the Secrets Manager secret holding the RDS secret JSON
	// (SourceSecretsManager).
	SecretARN string

	// Host, Port and Database name the server for SourceIAM, and override
	// the secret's host, port and dbname for SourceSecretsManager (for
	// example to go through RDS Proxy). Port 0 means the secret's port, or
	// DefaultPort.
	Host     string
	Port     uint16
	Database string
	// User is the database user for SourceIAM.
	User string

	// SSLMode is the libpq sslmode. For SourceURL it overrides the URL's;
	// for the other sources it defaults to DefaultSSLMode, and SourceIAM
	// refuses anything weaker than require.
	SSLMode string
	// SSLRootCert is the CA bundle file for verify-ca and verify-full
	// (SourceSecretsManager and SourceIAM; RDS certificates chain to the
	// RDS CAs, which are not in the system trust store).
	SSLRootCert string

	// MaxConns caps the pool (1..MaxMaxConns; 0: DefaultMaxConns).
	MaxConns int32
	// Pooler is the pooler in front of the server ("": PoolerNone).
	// PoolerTransaction implies SimpleProtocol.
	Pooler Pooler
	// SimpleProtocol sends every query with the simple protocol: no
	// prepared statements, so RDS Proxy never pins a session. Otherwise
	// pgx prepares and caches statements per connection.
	SimpleProtocol bool
	// StatementTimeout and IdleInTransactionTimeout are the sessions'
	// statement_timeout and idle_in_transaction_session_timeout (0: the
	// defaults): startup parameters of each connection, or with
	// PoolerTransaction set in each transaction.
	StatementTimeout         time.Duration
	IdleInTransactionTimeout time.Duration
	// ConnectTimeout bounds each connection attempt and each secret fetch
	// (0: DefaultConnectTimeout).
	ConnectTimeout time.Duration

	// Names names the settings in error messages; it is not printed.
	Names Names
}

// String summarises the configuration on one line, without secrets.
func (c Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dbpool.Config{source=%s", c.Source)
	switch c.Source {
	case SourceURL:
		fmt.Fprintf(&b, " url=%s", c.DatabaseURL)
	case SourceSecretsManager:
		fmt.Fprintf(&b, " secret_arn=%s", c.SecretARN)
	}
	for _, kv := range [][2]string{{"host", c.Host}, {"database", c.Database}, {"user", c.User}, {"sslmode", c.SSLMode}, {"sslrootcert", c.SSLRootCert}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s=%s", kv[0], kv[1])
		}
	}
	if c.Port != 0 {
		fmt.Fprintf(&b, " port=%d", c.Port)
	}
	if c.Pooler != "" {
		fmt.Fprintf(&b, " pooler=%s", c.Pooler)
	}
	fmt.Fprintf(&b, " max_conns=%d simple_protocol=%t statement_timeout=%s idle_in_transaction_timeout=%s connect_timeout=%s}",
		c.MaxConns, c.SimpleProtocol, c.StatementTimeout, c.IdleInTransactionTimeout, c.ConnectTimeout)
	return b.String()
}

// GoString is String: %#v must not print the password either.
func (c Config) GoString() string { return c.String() }

// LogValue logs the configuration as a group, without secrets.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("source", string(c.Source))}
	add := func(key, value string) {
		if value != "" {
			attrs = append(attrs, slog.String(key, value))
		}
	}
	add("url", c.DatabaseURL.String())
	add("secret_arn", c.SecretARN)
	add("host", c.Host)
	if c.Port != 0 {
		attrs = append(attrs, slog.Int("port", int(c.Port)))
	}
	add("database", c.Database)
	add("user", c.User)
	add("sslmode", c.SSLMode)
	add("sslrootcert", c.SSLRootCert)
	add("pooler", string(c.Pooler))
	attrs = append(attrs,
		slog.Int("max_conns", int(c.MaxConns)),
		slog.Bool("simple_protocol", c.SimpleProtocol),
		slog.Duration("statement_timeout", c.StatementTimeout),
		slog.Duration("idle_in_transaction_timeout", c.IdleInTransactionTimeout),
		slog.Duration("connect_timeout", c.ConnectTimeout))
	return slog.GroupValue(attrs...)
}

// Problem is one thing wrong with the configuration: Field is the setting
// at fault, by its name in Config.Names ("" when the problem is that no
// source is set at all).
type Problem = configerr.Problem

// ConfigError lists every problem found in a configuration, so that one
// failed cold start shows them all.
type ConfigError = configerr.Error

// NewConfigError is the error for ps, its problems on one line so that a
// log search for a setting's name finds it.
func NewConfigError(ps []Problem) *ConfigError {
	return &ConfigError{Subject: "dbpool", What: "database configuration", OneLine: true, Problems: ps}
}

type problems []Problem

func (ps *problems) add(setting, format string, args ...any) {
	*ps = append(*ps, Problem{Field: setting, Message: fmt.Sprintf(format, args...)})
}

func (ps problems) err() error {
	if len(ps) == 0 {
		return nil
	}
	return NewConfigError(ps)
}

// Validate reports every problem of the configuration at once, as a
// *ConfigError naming each setting by Names; zero optional fields count as
// their defaults. Open calls it.
func (c Config) Validate() error {
	c = c.WithDefaults()
	ps := c.settingProblems()
	if sources := c.sources(); len(sources) > 1 {
		ps.add(sources[0], "conflicts with %s: set exactly one database source", strings.Join(sources[1:], " and "))
	} else {
		ps = append(ps, c.sourceProblems()...)
	}
	return ps.err()
}

// sources names every source the configuration holds: more than one is a
// conflict, whichever Source says.
func (c Config) sources() []string {
	var set []string
	if c.DatabaseURL != "" {
		set = append(set, c.Names.DatabaseURL)
	}
	if c.SecretARN != "" {
		set = append(set, c.Names.SecretARN)
	}
	if c.Source == SourceIAM {
		set = append(set, c.Names.IAM)
	}
	return set
}

func (c Config) noSourceMessage() string {
	n := c.Names
	return "no database configured: set " + n.DatabaseURL + " (a connection string), or " +
		n.SecretARN + " (a Secrets Manager secret in the RDS format), or " + n.IAM + " with " +
		n.Host + ", " + n.Database + " and " + n.User + " (RDS IAM authentication)"
}

// WithDefaults fills the zero optional fields, and the names.
func (c Config) WithDefaults() Config {
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
	if c.IdleInTransactionTimeout == 0 {
		c.IdleInTransactionTimeout = DefaultIdleInTransactionTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.Pooler == "" {
		c.Pooler = PoolerNone
	}
	if c.Pooler == PoolerTransaction {
		c.SimpleProtocol = true
	}
	if c.Source == SourceIAM && c.Port == 0 {
		c.Port = DefaultPort
	}
	if (c.Source == SourceIAM || c.Source == SourceSecretsManager) && c.SSLMode == "" {
		c.SSLMode = DefaultSSLMode
	}
	c.Names = c.Names.withDefaults()
	return c
}

var sslModes = []string{"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}

// settingProblems checks the settings common to all sources, once the
// defaults are filled.
func (c Config) settingProblems() problems {
	var ps problems
	n := c.Names
	if c.MaxConns < 1 || c.MaxConns > MaxMaxConns {
		ps.add(n.MaxConns, "must be from 1 to %d, got %d", MaxMaxConns, c.MaxConns)
	}
	checkTimeout(&ps, n.StatementTimeout, c.StatementTimeout, MaxSessionTimeout)
	checkTimeout(&ps, n.IdleInTransactionTimeout, c.IdleInTransactionTimeout, MaxSessionTimeout)
	checkTimeout(&ps, n.ConnectTimeout, c.ConnectTimeout, MaxConnectTimeout)
	if c.SSLMode != "" && !slices.Contains(sslModes, c.SSLMode) {
		ps.add(n.SSLMode, "must be one of %s, got %s", strings.Join(sslModes, ", "), QuoteValue(c.SSLMode))
	}
	if !slices.Contains(poolers, string(c.Pooler)) {
		ps.add(n.Pooler, "must be %s (a transaction pooler such as PgBouncer's pool_mode = transaction) or %s, got %s",
			PoolerTransaction, PoolerNone, QuoteValue(string(c.Pooler)))
	}
	return ps
}

// sourceProblems checks the source and the settings that belong to it.
func (c Config) sourceProblems() problems {
	var ps problems
	n := c.Names

	// Settings that the source would silently ignore are errors: an
	// operator who set them expects them to matter.
	ignored := func(setting, value, why string) {
		if value != "" {
			ps.add(setting, "has no effect with %s: %s", c.sourceName(), why)
		}
	}
	switch c.Source {
	case SourceURL:
		if c.DatabaseURL == "" {
			ps.add(n.DatabaseURL, "is empty")
		} else if scheme, ok := foreignScheme(string(c.DatabaseURL)); ok {
			// pgx would read it as key=value pairs and say only that
			// they cannot be tokenized.
			ps.add(n.DatabaseURL, "is not a PostgreSQL URL: its scheme is %s://, want postgres:// or postgresql://", scheme)
		} else if _, err := pgxpool.ParseConfig(urlConnString(c.withValidSSLMode())); err != nil {
			// pgx's message shows the string with the password masked as
			// best it can; scrub what it may have missed (a URL parse
			// error quotes the raw URL).
			detail := "it cannot be tokenized as key=value pairs"
			if secrets, ok := connStringSecrets(string(c.DatabaseURL)); ok {
				detail = scrub(err.Error(), secrets...)
			}
			ps.add(n.DatabaseURL, "is not a valid PostgreSQL connection string: %s", detail)
		}
		const why = "put it in the connection string"
		ignored(n.Host, c.Host, why)
		ignored(n.Port, portString(c.Port), why)
		ignored(n.Database, c.Database, why)
		ignored(n.User, c.User, why)
		ignored(n.SSLRootCert, c.SSLRootCert, "put sslrootcert in the connection string")
	case SourceSecretsManager:
		if err := checkSecretARN(c.SecretARN); err != nil {
			ps.add(n.SecretARN, "%v", err)
		}
		if c.Host != "" {
			c.checkHost(&ps)
		}
		ignored(n.User, c.User, "the user comes from the secret")
	case SourceIAM:
		if c.Host == "" {
			ps.add(n.Host, "is required with %s (the database or RDS Proxy endpoint)", n.IAM)
		} else {
			c.checkHost(&ps)
		}
		if c.Database == "" {
			ps.add(n.Database, "is required with %s", n.IAM)
		}
		if c.User == "" {
			ps.add(n.User, "is required with %s (a database user granted rds_iam)", n.IAM)
		}
		if slices.Contains([]string{"disable", "allow", "prefer"}, c.SSLMode) {
			ps.add(n.SSLMode, "must be require, verify-ca or verify-full with %s: RDS refuses IAM authentication without TLS, got %s", n.IAM, QuoteValue(c.SSLMode))
		}
	default:
		ps = append(ps, Problem{Message: c.noSourceMessage()})
	}
	return ps
}

// withValidSSLMode drops an sslmode that settingProblems has already
// reported, so that it is not reported again as a bad connection string.
func (c Config) withValidSSLMode() Config {
	if !slices.Contains(sslModes, c.SSLMode) {
		c.SSLMode = ""
	}
	return c
}

// NeedSession refuses cfg for what needs a session of its own on the
// server, which a transaction pooler cannot give: what (for example "the
// migrations", which hold a session-level advisory lock while they run)
// names it in the error.
func (c Config) NeedSession(what string) error {
	if c.Pooler != PoolerTransaction {
		return nil
	}
	n := c.Names.withDefaults()
	return fmt.Errorf("dbpool: %s need a session of their own, which a transaction pooler (%s=%s) cannot keep: connect to the database itself, without the pooler (%s=%s)",
		what, n.Pooler, PoolerTransaction, n.Pooler, PoolerNone)
}

// sourceName names the setting that selects the source.
func (c Config) sourceName() string {
	switch c.Source {
	case SourceURL:
		return c.Names.DatabaseURL
	case SourceSecretsManager:
		return c.Names.SecretARN
	case SourceIAM:
		return c.Names.IAM
	}
	return string(c.Source)
}

func checkTimeout(ps *problems, setting string, d, maximum time.Duration) {
	if d < MinTimeout || d > maximum {
		ps.add(setting, "must be from %s to %s, got %s", MinTimeout, maximum, d)
	}
}

// hostPattern admits DNS names and IPv4 literals; IPv6 literals are checked
// with net.ParseIP. A comma (a multi-host list) or a slash (a socket path)
// would be misread when the host is put into a URL or signed into a token.
var hostPattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$`)

func (c Config) checkHost(ps *problems) {
	if err := validHost(c.Host); err != nil {
		ps.add(c.Names.Host, "%v", err)
	}
}

func validHost(host string) error {
	if hostPattern.MatchString(host) || net.ParseIP(host) != nil {
		return nil
	}
	return fmt.Errorf("must be a host name or IP address, got %s", QuoteValue(host))
}

// checkSecretARN accepts only a full secret ARN: the region in it decides
// which regional endpoint to ask, and a name or partial ARN would silently
// resolve against the function's own account and region.
func checkSecretARN(s string) error {
	a, err := arn.Parse(s)
	if err != nil {
		return fmt.Errorf("must be a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>), got %s", QuoteValue(s))
	}
	switch {
	case a.Service != "secretsmanager":
		return fmt.Errorf("must be a Secrets Manager secret ARN, got an ARN of service %q", a.Service)
	case a.Region == "":
		return fmt.Errorf("must name a region, got %s", QuoteValue(s))
	case !isAccountID(a.AccountID):
		return fmt.Errorf("must name a 12-digit account id, got %s", QuoteValue(s))
	case !strings.HasPrefix(a.Resource, "secret:") || len(a.Resource) == len("secret:"):
		return fmt.Errorf("must name a secret (…:secret:<name>), got %s", QuoteValue(s))
	}
	return nil
}

func isAccountID(s string) bool {
	if len(s) != 12 {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// QuoteValue quotes a (non-secret) value for an error message, cut short so
// that a pasted blob does not flood the log.
func QuoteValue(v string) string {
	const limit = 80
	if len(v) > limit {
		return strconv.Quote(v[:limit]) + "…"
	}
	return strconv.Quote(v)
}

func portString(p uint16) string {
	if p == 0 {
		return ""
	}
	return strconv.Itoa(int(p))
}

// foreignScheme returns the scheme of a URL whose scheme is not
// PostgreSQL's (a typo such as postgress://, or another database's), and
// whether there is one.
func foreignScheme(connString string) (string, bool) {
	scheme, _, ok := strings.Cut(connString, "://")
	if !ok || scheme == "" || !isSchemeLetter(scheme[0], true) {
		return "", false
	}
	for i := 1; i < len(scheme); i++ {
		if !isSchemeLetter(scheme[i], false) {
			return "", false // a key=value string with "://" in a value
		}
	}
	switch scheme { // pgx takes these two only, in lower case
	case "postgres", "postgresql":
		return "", false
	}
	return scheme, true
}

// isSchemeLetter reports whether b may be in a URL's scheme (RFC 3986: a
// letter first, then letters, digits, +, - and .).
func isSchemeLetter(b byte, first bool) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z':
		return true
	case first:
		return false
	}
	return '0' <= b && b <= '9' || b == '+' || b == '-' || b == '.'
}
