package pgconn

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
)

// The environment variables LoadConfig reads. Every configuration error
// names one of them.
const (
	EnvDatabaseURL              = "OUTBOX_DATABASE_URL"
	EnvSecretARN                = "OUTBOX_DB_SECRET_ARN"
	EnvIAMAuth                  = "OUTBOX_DB_IAM_AUTH"
	EnvHost                     = "OUTBOX_DB_HOST"
	EnvPort                     = "OUTBOX_DB_PORT"
	EnvDatabaseName             = "OUTBOX_DB_NAME"
	EnvUser                     = "OUTBOX_DB_USER"
	EnvSSLMode                  = "OUTBOX_DB_SSLMODE"
	EnvSSLRootCert              = "OUTBOX_DB_SSLROOTCERT"
	EnvMaxConns                 = "OUTBOX_DB_MAX_CONNS"
	EnvSimpleProtocol           = "OUTBOX_DB_SIMPLE_PROTOCOL"
	EnvStatementTimeout         = "OUTBOX_DB_STATEMENT_TIMEOUT"
	EnvIdleInTransactionTimeout = "OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT"
	EnvConnectTimeout           = "OUTBOX_DB_CONNECT_TIMEOUT"
)

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
	// MaxMaxConns caps OUTBOX_DB_MAX_CONNS: every Lambda execution
	// environment holds its own pool, so the server sees this times the
	// function's concurrency.
	MaxMaxConns = 100
	// MinTimeout is the smallest timeout: the server counts milliseconds,
	// and 0 would mean no timeout at all.
	MinTimeout = time.Millisecond
	// MaxSessionTimeout caps the statement and idle-in-transaction
	// timeouts.
	MaxSessionTimeout = 24 * time.Hour
	// MaxConnectTimeout caps OUTBOX_DB_CONNECT_TIMEOUT.
	MaxConnectTimeout = 5 * time.Minute
)

// Source is where the database credentials come from.
type Source string

// The database sources; a Config has exactly one.
const (
	// SourceURL connects with a connection string (EnvDatabaseURL).
	SourceURL Source = "url"
	// SourceSecretsManager reads an RDS secret from Secrets Manager
	// (EnvSecretARN), and reads it again when the database rejects the
	// password, so that a rotation heals without a restart.
	SourceSecretsManager Source = "secretsmanager"
	// SourceIAM authenticates with a fresh RDS IAM auth token per connection
	// (EnvIAMAuth).
	SourceIAM Source = "iam"
)

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
	// SimpleProtocol sends every query with the simple protocol: no
	// prepared statements, so RDS Proxy never pins a session. Otherwise
	// pgx prepares and caches statements per connection.
	SimpleProtocol bool
	// StatementTimeout and IdleInTransactionTimeout are the sessions'
	// statement_timeout and idle_in_transaction_session_timeout, sent as
	// startup parameters (0: the defaults).
	StatementTimeout         time.Duration
	IdleInTransactionTimeout time.Duration
	// ConnectTimeout bounds each connection attempt and each secret fetch
	// (0: DefaultConnectTimeout).
	ConnectTimeout time.Duration
}

// String summarises the configuration on one line, without secrets.
func (c Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pgconn.Config{source=%s", c.Source)
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
	attrs = append(attrs,
		slog.Int("max_conns", int(c.MaxConns)),
		slog.Bool("simple_protocol", c.SimpleProtocol),
		slog.Duration("statement_timeout", c.StatementTimeout),
		slog.Duration("idle_in_transaction_timeout", c.IdleInTransactionTimeout),
		slog.Duration("connect_timeout", c.ConnectTimeout))
	return slog.GroupValue(attrs...)
}

// Problem is one thing wrong with the configuration.
type Problem struct {
	// Variable is the environment variable at fault ("" when the problem is
	// that no source is set at all).
	Variable string
	// Message says what is wrong and, where it helps, what to do.
	Message string
}

// String is "VARIABLE: message".
func (p Problem) String() string {
	if p.Variable == "" {
		return p.Message
	}
	return p.Variable + ": " + p.Message
}

// ConfigError lists every problem found in a configuration, so that one
// failed cold start shows them all.
type ConfigError struct {
	Problems []Problem
}

// Error lists the problems on one line, so that a log search for the
// variable's name finds it.
func (e *ConfigError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return "pgconn: invalid database configuration: " + strings.Join(parts, "; ")
}

type problems []Problem

func (ps *problems) add(variable, format string, args ...any) {
	*ps = append(*ps, Problem{Variable: variable, Message: fmt.Sprintf(format, args...)})
}

func (ps problems) err() error {
	if len(ps) == 0 {
		return nil
	}
	return &ConfigError{Problems: ps}
}

// LoadConfig reads the database configuration from the environment (pass
// os.Getenv) and validates it. An empty variable counts as unset. The error,
// a *ConfigError, lists every problem at once, each naming its variable; it
// never contains the password of a connection string.
func LoadConfig(getenv func(string) string) (Config, error) {
	var ps problems
	cfg := Config{
		DatabaseURL: ConnString(getenv(EnvDatabaseURL)),
		SecretARN:   getenv(EnvSecretARN),
		Host:        getenv(EnvHost),
		Database:    getenv(EnvDatabaseName),
		User:        getenv(EnvUser),
		SSLMode:     getenv(EnvSSLMode),
		SSLRootCert: getenv(EnvSSLRootCert),
	}
	iam := parseBool(&ps, getenv, EnvIAMAuth)
	cfg.SimpleProtocol = parseBool(&ps, getenv, EnvSimpleProtocol)
	if v := getenv(EnvPort); v != "" {
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil || n == 0 {
			ps.add(EnvPort, "must be a port number from 1 to 65535, got %s", quoteValue(v))
		} else {
			cfg.Port = uint16(n)
		}
	}
	if v := getenv(EnvMaxConns); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		switch {
		case err != nil:
			ps.add(EnvMaxConns, "must be an integer from 1 to %d, got %s", MaxMaxConns, quoteValue(v))
		case n < 1 || n > MaxMaxConns:
			ps.add(EnvMaxConns, "must be from 1 to %d, got %d", MaxMaxConns, n)
		default:
			cfg.MaxConns = int32(n)
		}
	}
	cfg.StatementTimeout = parseDuration(&ps, getenv, EnvStatementTimeout, MaxSessionTimeout)
	cfg.IdleInTransactionTimeout = parseDuration(&ps, getenv, EnvIdleInTransactionTimeout, MaxSessionTimeout)
	cfg.ConnectTimeout = parseDuration(&ps, getenv, EnvConnectTimeout, MaxConnectTimeout)

	// The source: exactly one of three.
	var set []string
	if cfg.DatabaseURL != "" {
		set = append(set, EnvDatabaseURL)
		cfg.Source = SourceURL
	}
	if cfg.SecretARN != "" {
		set = append(set, EnvSecretARN)
		cfg.Source = SourceSecretsManager
	}
	if iam {
		set = append(set, EnvIAMAuth+"=true")
		cfg.Source = SourceIAM
	}
	cfg = cfg.withDefaults()
	ps = append(ps, cfg.settingProblems()...)
	switch len(set) {
	case 0:
		ps = append(ps, Problem{Message: noSourceMessage})
	case 1:
		ps = append(ps, cfg.sourceProblems()...)
	default:
		ps.add(set[0], "conflicts with %s: set exactly one database source", strings.Join(set[1:], " and "))
	}
	if err := ps.err(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

const noSourceMessage = "no database configured: set " + EnvDatabaseURL + " (a connection string), or " +
	EnvSecretARN + " (a Secrets Manager secret in the RDS format), or " + EnvIAMAuth + "=true with " +
	EnvHost + ", " + EnvDatabaseName + " and " + EnvUser + " (RDS IAM authentication)"

// Validate checks a configuration built by hand (LoadConfig's result is
// already valid); zero optional fields count as their defaults. Open calls it.
func (c Config) Validate() error {
	c = c.withDefaults()
	return append(c.settingProblems(), c.sourceProblems()...).err()
}

// withDefaults fills the zero optional fields.
func (c Config) withDefaults() Config {
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
	if c.Source == SourceIAM && c.Port == 0 {
		c.Port = DefaultPort
	}
	if (c.Source == SourceIAM || c.Source == SourceSecretsManager) && c.SSLMode == "" {
		c.SSLMode = DefaultSSLMode
	}
	return c
}

var sslModes = []string{"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}

// settingProblems checks the settings common to all sources, once the
// defaults are filled.
func (c Config) settingProblems() problems {
	var ps problems
	if c.MaxConns < 1 || c.MaxConns > MaxMaxConns {
		ps.add(EnvMaxConns, "must be from 1 to %d, got %d", MaxMaxConns, c.MaxConns)
	}
	checkTimeout(&ps, EnvStatementTimeout, c.StatementTimeout, MaxSessionTimeout)
	checkTimeout(&ps, EnvIdleInTransactionTimeout, c.IdleInTransactionTimeout, MaxSessionTimeout)
	checkTimeout(&ps, EnvConnectTimeout, c.ConnectTimeout, MaxConnectTimeout)
	if c.SSLMode != "" && !slices.Contains(sslModes, c.SSLMode) {
		ps.add(EnvSSLMode, "must be one of %s, got %s", strings.Join(sslModes, ", "), quoteValue(c.SSLMode))
	}
	return ps
}

// sourceProblems checks the source and the settings that belong to it.
func (c Config) sourceProblems() problems {
	var ps problems

	// Settings that the source would silently ignore are errors: an
	// operator who set them expects them to matter.
	ignored := func(variable, value, why string) {
		if value != "" {
			ps.add(variable, "has no effect with %s: %s", sourceVariable(c.Source), why)
		}
	}
	switch c.Source {
	case SourceURL:
		if c.DatabaseURL == "" {
			ps.add(EnvDatabaseURL, "is empty")
		} else if _, err := pgxpool.ParseConfig(urlConnString(c.withValidSSLMode())); err != nil {
			// pgx's message shows the string with the password masked as
			// best it can; scrub what it may have missed (a URL parse
			// error quotes the raw URL).
			detail := "it cannot be tokenized as key=value pairs"
			if secrets, ok := connStringSecrets(string(c.DatabaseURL)); ok {
				detail = scrub(err.Error(), secrets...)
			}
			ps.add(EnvDatabaseURL, "is not a valid PostgreSQL connection string: %s", detail)
		}
		const why = "put it in the connection string"
		ignored(EnvHost, c.Host, why)
		ignored(EnvPort, portString(c.Port), why)
		ignored(EnvDatabaseName, c.Database, why)
		ignored(EnvUser, c.User, why)
		ignored(EnvSSLRootCert, c.SSLRootCert, "put sslrootcert in the connection string")
	case SourceSecretsManager:
		if err := checkSecretARN(c.SecretARN); err != nil {
			ps.add(EnvSecretARN, "%v", err)
		}
		if c.Host != "" {
			checkHost(&ps, c.Host)
		}
		ignored(EnvUser, c.User, "the user comes from the secret")
	case SourceIAM:
		if c.Host == "" {
			ps.add(EnvHost, "is required with %s=true (the database or RDS Proxy endpoint)", EnvIAMAuth)
		} else {
			checkHost(&ps, c.Host)
		}
		if c.Database == "" {
			ps.add(EnvDatabaseName, "is required with %s=true", EnvIAMAuth)
		}
		if c.User == "" {
			ps.add(EnvUser, "is required with %s=true (a database user granted rds_iam)", EnvIAMAuth)
		}
		if slices.Contains([]string{"disable", "allow", "prefer"}, c.SSLMode) {
			ps.add(EnvSSLMode, "must be require, verify-ca or verify-full with %s=true: RDS refuses IAM authentication without TLS, got %s", EnvIAMAuth, quoteValue(c.SSLMode))
		}
	default:
		ps = append(ps, Problem{Message: noSourceMessage})
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

// sourceVariable names the variable that selects a source.
func sourceVariable(s Source) string {
	switch s {
	case SourceURL:
		return EnvDatabaseURL
	case SourceSecretsManager:
		return EnvSecretARN
	case SourceIAM:
		return EnvIAMAuth + "=true"
	}
	return string(s)
}

func checkTimeout(ps *problems, variable string, d, maximum time.Duration) {
	if d < MinTimeout || d > maximum {
		ps.add(variable, "must be from %s to %s, got %s", MinTimeout, maximum, d)
	}
}

// hostPattern admits DNS names and IPv4 literals; IPv6 literals are checked
// with net.ParseIP. A comma (a multi-host list) or a slash (a socket path)
// would be misread when the host is put into a URL or signed into a token.
var hostPattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$`)

func checkHost(ps *problems, host string) {
	if err := validHost(host); err != nil {
		ps.add(EnvHost, "%v", err)
	}
}

func validHost(host string) error {
	if hostPattern.MatchString(host) || net.ParseIP(host) != nil {
		return nil
	}
	return fmt.Errorf("must be a host name or IP address, got %s", quoteValue(host))
}

// checkSecretARN accepts only a full secret ARN: the region in it decides
// which regional endpoint to ask, and a name or partial ARN would silently
// resolve against the function's own account and region.
func checkSecretARN(s string) error {
	a, err := arn.Parse(s)
	if err != nil {
		return fmt.Errorf("must be a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>), got %s", quoteValue(s))
	}
	switch {
	case a.Service != "secretsmanager":
		return fmt.Errorf("must be a Secrets Manager secret ARN, got an ARN of service %q", a.Service)
	case a.Region == "":
		return fmt.Errorf("must name a region, got %s", quoteValue(s))
	case !isAccountID(a.AccountID):
		return fmt.Errorf("must name a 12-digit account id, got %s", quoteValue(s))
	case !strings.HasPrefix(a.Resource, "secret:") || len(a.Resource) == len("secret:"):
		return fmt.Errorf("must name a secret (…:secret:<name>), got %s", quoteValue(s))
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

// parseBool accepts exactly true, false, 1 and 0: a typo such as "ture" or
// "yes" must fail the cold start, not quietly mean false.
func parseBool(ps *problems, getenv func(string) string, variable string) bool {
	switch v := getenv(variable); v {
	case "", "false", "0":
		return false
	case "true", "1":
		return true
	default:
		ps.add(variable, "must be true, false, 1 or 0, got %s", quoteValue(v))
		return false
	}
}

// parseDuration returns 0 (the default) when the variable is unset or bad.
func parseDuration(ps *problems, getenv func(string) string, variable string, maximum time.Duration) time.Duration {
	v := getenv(variable)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		ps.add(variable, "must be a Go duration such as 300ms, 30s or 1m, got %s", quoteValue(v))
		return 0
	}
	if d < MinTimeout || d > maximum {
		ps.add(variable, "must be from %s to %s, got %s", MinTimeout, maximum, quoteValue(v))
		return 0
	}
	return d
}

// quoteValue quotes a (non-secret) value for an error message, cut short so
// that a pasted blob does not flood the log.
func quoteValue(v string) string {
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
