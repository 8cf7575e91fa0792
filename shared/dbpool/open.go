package dbpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/arn"
	"github.com/aws/aws-sdk-go-v2/feature/rds/auth"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SecretsManagerAPI is the one Secrets Manager call this package makes.
type SecretsManagerAPI interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

var _ SecretsManagerAPI = (*secretsmanager.Client)(nil)

// Deps are what Open needs besides the configuration.
type Deps struct {
	// AWS is the AWS configuration: the region and credentials that sign
	// RDS IAM auth tokens, and the base of the Secrets Manager client.
	AWS aws.Config
	// SecretsManager reads the database secret. Nil: a client built from
	// AWS, in the secret ARN's region.
	SecretsManager SecretsManagerAPI
	// ApplicationName is the sessions' application_name, which names the
	// function in pg_stat_activity and the server log (for example
	// "outbox-dispatcher/dispatch"). Empty: DefaultApplicationName.
	ApplicationName string
	// Logger receives the few events worth an operator's attention (the
	// database rejecting a secret, the secret fetched again). Nil:
	// slog.Default().
	Logger *slog.Logger
	// ConfigurePool, if set, adjusts the pool configuration after this
	// package has filled it in and before the pool is built: to add a
	// tracer, wrap the dialer, or (in tests) change TLS. This package's
	// BeforeConnect hook and tracer are chained with any it sets, not
	// replaced: ours run first.
	ConfigurePool func(*pgxpool.Config)
}

// Open builds the connection pool described by cfg and pings it once, so
// that a bad configuration fails the cold start rather than the first
// invocation. For SourceSecretsManager it fetches the secret first. The
// error, if any, names the source and never contains a password.
func Open(ctx context.Context, cfg Config, deps Deps) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	c, err := newConnector(ctx, cfg, deps)
	if err != nil {
		return nil, err
	}
	pc, err := c.poolConfig()
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, c.fail("build the pool for the database", err)
	}
	c.failover.pool.Store(pool)
	if err := c.ping(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return newPool(pool, cfg), nil
}

// connector is what one pool needs to open connections from its source.
type connector struct {
	cfg    Config
	deps   Deps
	logger *slog.Logger
	// target describes the database for errors: the source variable and
	// where it points, without secrets.
	target string
	// connString is the base connection string; for the Secrets Manager
	// and IAM sources it has no password, which BeforeConnect supplies.
	connString string

	secrets *secretSource // SourceSecretsManager only
	iam     *iamAuth      // SourceIAM only

	failover *failoverObserver
}

func newConnector(ctx context.Context, cfg Config, deps Deps) (*connector, error) {
	c := &connector{cfg: cfg, deps: deps, logger: deps.Logger}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	c.failover = &failoverObserver{logger: c.logger}
	if cfg.SSLRootCert != "" {
		if _, err := os.Stat(cfg.SSLRootCert); err != nil {
			return nil, fmt.Errorf("dbpool: %s: cannot read the CA bundle: %w", cfg.Names.SSLRootCert, err)
		}
	}
	switch cfg.Source {
	case SourceURL:
		c.connString = urlConnString(cfg)
		c.target = cfg.Names.DatabaseURL + "=" + Redact(c.connString)

	case SourceSecretsManager:
		c.secrets = &secretSource{arn: cfg.SecretARN, name: cfg.Names.SecretARN, client: deps.SecretsManager, timeout: cfg.ConnectTimeout, logger: c.logger}
		if c.secrets.client == nil {
			// The ARN's region, not the function's: a secret may live in
			// another region, and a full ARN only resolves at its own.
			parsed, _ := arn.Parse(cfg.SecretARN) // validated
			c.secrets.client = secretsmanager.NewFromConfig(deps.AWS, func(o *secretsmanager.Options) { o.Region = parsed.Region })
		}
		secret, err := c.secrets.credentials(ctx)
		if err != nil {
			return nil, err
		}
		host, port, database, err := secretTarget(cfg, secret)
		if err != nil {
			return nil, err
		}
		c.connString = buildConnString(secret.Username, host, port, database, cfg)
		c.target = fmt.Sprintf("%s=%s user=%s host=%s port=%d database=%s sslmode=%s",
			cfg.Names.SecretARN, cfg.SecretARN, secret.Username, host, port, database, cfg.SSLMode)

	case SourceIAM:
		if deps.AWS.Region == "" {
			return nil, fmt.Errorf("dbpool: RDS IAM authentication (%s) needs an AWS region to sign tokens in: set AWS_REGION", cfg.Names.IAM)
		}
		if deps.AWS.Credentials == nil {
			return nil, fmt.Errorf("dbpool: RDS IAM authentication (%s) needs AWS credentials to sign tokens with", cfg.Names.IAM)
		}
		c.iam = &iamAuth{
			endpoint: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))),
			region:   deps.AWS.Region,
			user:     cfg.User,
			creds:    deps.AWS.Credentials,
			source:   cfg.Names.IAM,
			timeout:  cfg.ConnectTimeout,
		}
		c.connString = buildConnString(cfg.User, cfg.Host, cfg.Port, cfg.Database, cfg)
		c.target = fmt.Sprintf("%s user=%s host=%s port=%d database=%s sslmode=%s region=%s",
			cfg.Names.IAM, cfg.User, cfg.Host, cfg.Port, cfg.Database, cfg.SSLMode, deps.AWS.Region)
	}
	return c, nil
}

// secretTarget is the server the secret names, with the Host, Port and
// Database overrides applied.
func secretTarget(cfg Config, secret *rdsSecret) (host string, port uint16, database string, err error) {
	host, port, database = secret.Host, secret.Port, secret.DBName
	if cfg.Host != "" {
		host = cfg.Host
	}
	if cfg.Port != 0 {
		port = cfg.Port
	}
	if port == 0 {
		port = DefaultPort
	}
	if cfg.Database != "" {
		database = cfg.Database
	}
	var missing []string
	if host == "" {
		missing = append(missing, fmt.Sprintf(`no "host" (set %s)`, cfg.Names.Host))
	}
	if database == "" {
		missing = append(missing, fmt.Sprintf(`no "dbname" (set %s)`, cfg.Names.Database))
	}
	if len(missing) > 0 {
		return "", 0, "", fmt.Errorf("dbpool: the database secret %s (%s) has %s", cfg.SecretARN, cfg.Names.SecretARN, joinAnd(missing))
	}
	return host, port, database, nil
}

func joinAnd(parts []string) string {
	if len(parts) == 2 {
		return parts[0] + " and " + parts[1]
	}
	return parts[0]
}

// buildConnString is a URL without a password: BeforeConnect sets it per
// connection, so that it never sits in a string that might be printed.
func buildConnString(user, host string, port uint16, database string, cfg Config) string {
	q := url.Values{}
	q.Set("sslmode", cfg.SSLMode)
	if cfg.SSLRootCert != "" {
		q.Set("sslrootcert", cfg.SSLRootCert)
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(user),
		Host:     net.JoinHostPort(host, strconv.Itoa(int(port))),
		Path:     "/" + database,
		RawQuery: q.Encode(),
	}
	return u.String()
}

// urlConnString is DatabaseURL with the SSLMode override applied.
func urlConnString(cfg Config) string {
	s := string(cfg.DatabaseURL)
	if cfg.SSLMode != "" {
		s = setConnStringParam(s, "sslmode", cfg.SSLMode)
	}
	return s
}

// poolConfig parses the base connection string and applies the settings
// and hooks.
func (c *connector) poolConfig() (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(c.connString)
	if err != nil {
		return nil, c.fail("parse the connection settings of the database", err)
	}
	pc.MaxConns = c.cfg.MaxConns
	// Nothing opens in the background: between invocations Lambda freezes
	// the process, and a connection is made when an invocation needs one.
	pc.MinConns, pc.MinIdleConns = 0, 0

	cc := pc.ConnConfig
	cc.ConnectTimeout = c.cfg.ConnectTimeout
	if c.cfg.SimpleProtocol {
		cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	} else {
		cc.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	}
	// Startup parameters, not SET statements: RDS Proxy pins a client to
	// its server connection for the rest of the session after a SET. A
	// transaction pooler refuses them (PgBouncer: "unsupported startup
	// parameter"), and Pool sets them in each transaction instead.
	if c.cfg.Pooler != PoolerTransaction {
		cc.RuntimeParams["statement_timeout"] = milliseconds(c.cfg.StatementTimeout)
		cc.RuntimeParams["idle_in_transaction_session_timeout"] = milliseconds(c.cfg.IdleInTransactionTimeout)
	}
	switch {
	case c.deps.ApplicationName != "":
		cc.RuntimeParams["application_name"] = c.deps.ApplicationName
	case cc.RuntimeParams["application_name"] == "":
		cc.RuntimeParams["application_name"] = DefaultApplicationName
	}

	if c.deps.ConfigurePool != nil {
		c.deps.ConfigurePool(pc)
	}

	if c.secrets != nil || c.iam != nil {
		theirs := pc.BeforeConnect
		pc.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
			if err := c.beforeConnect(ctx, cc); err != nil {
				return err
			}
			if theirs != nil {
				return theirs(ctx, cc)
			}
			return nil
		}
	}
	var tracers []pgx.QueryTracer
	if theirs := pc.ConnConfig.Tracer; theirs != nil {
		tracers = append(tracers, theirs)
	}
	if c.secrets != nil {
		tracers = append(tracers, &authFailureObserver{rejected: c.secrets.rejected})
	}
	tracers = append(tracers, c.failover)
	if len(tracers) == 1 {
		pc.ConnConfig.Tracer = tracers[0]
	} else {
		pc.ConnConfig.Tracer = multitracer.New(tracers...)
	}
	return pc, nil
}

// beforeConnect supplies the credentials of one new connection.
func (c *connector) beforeConnect(ctx context.Context, cc *pgx.ConnConfig) error {
	switch {
	case c.secrets != nil:
		secret, err := c.secrets.credentials(ctx)
		if err != nil {
			return err
		}
		cc.User, cc.Password = secret.Username, secret.Password
	case c.iam != nil:
		token, err := c.iam.token(ctx)
		if err != nil {
			return err
		}
		cc.Password = token
	}
	return nil
}

// ping checks that a connection can be made. A cold start that raced a
// password rotation gets one more try: the failed attempt has marked the
// secret stale, so the second one fetches it again.
func (c *connector) ping(ctx context.Context, pool *pgxpool.Pool) error {
	// Each attempt may fetch the secret and connect, each bounded by the
	// connect timeout; the ping itself is one empty round trip.
	attempt := func() error {
		ctx, cancel := context.WithTimeout(ctx, 3*c.cfg.ConnectTimeout)
		defer cancel()
		return pool.Ping(ctx)
	}
	err := attempt()
	if err != nil && c.secrets != nil && authFailureCode(err) != "" {
		err = attempt()
	}
	if err != nil {
		if c.cfg.Pooler != PoolerTransaction && refusedStartupParameter(err) {
			err = fmt.Errorf("%w (a transaction pooler such as PgBouncer refuses the timeouts as startup parameters: set %s=%s)",
				err, c.cfg.Names.Pooler, PoolerTransaction)
		}
		return c.fail("connect to the database", err)
	}
	return nil
}

// refusedStartupParameter reports whether err is a pooler refusing a
// startup parameter, as PgBouncer does with its default
// ignore_startup_parameters (SQLSTATE 08P01, "unsupported startup
// parameter: statement_timeout").
func refusedStartupParameter(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.Contains(pgErr.Message, "unsupported startup parameter")
}

// fail wraps err with what was being done and to which database, scrubbed
// of every password this connector knows.
func (c *connector) fail(doing string, err error) error {
	var secrets []string
	if s, ok := connStringSecrets(c.connString); ok {
		secrets = append(secrets, s...)
	}
	if c.secrets != nil {
		secrets = append(secrets, c.secrets.passwords()...)
	}
	return redactError(fmt.Errorf("dbpool: %s (%s): %w", doing, c.target, err), secrets...)
}

func milliseconds(d time.Duration) string {
	return strconv.FormatInt(d.Milliseconds(), 10)
}

// authFailureCode returns the SQLSTATE of an authentication failure in err
// (28P01 invalid_password, 28000 invalid_authorization_specification), or
// "".
func authFailureCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000") {
		return pgErr.Code
	}
	return ""
}

// authFailureObserver is a pgx tracer that sees every connection attempt's
// outcome, which no pool hook does: it tells the secret source when the
// database rejected the password the attempt used.
type authFailureObserver struct {
	rejected func(password, sqlstate string)
}

var (
	_ pgx.QueryTracer   = (*authFailureObserver)(nil)
	_ pgx.ConnectTracer = (*authFailureObserver)(nil)
)

// attemptCredentials carries the attempt's password from TraceConnectStart
// to TraceConnectEnd. A struct, not a string: a context prints string
// values in its String method, and types otherwise.
type attemptCredentials struct{ password string }

type attemptCredentialsKey struct{}

// TraceConnectStart remembers the password the attempt uses.
func (o *authFailureObserver) TraceConnectStart(ctx context.Context, data pgx.TraceConnectStartData) context.Context {
	return context.WithValue(ctx, attemptCredentialsKey{}, &attemptCredentials{password: data.ConnConfig.Password})
}

// TraceConnectEnd reports a refusal of that password.
func (o *authFailureObserver) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	code := authFailureCode(data.Err)
	if code == "" {
		return
	}
	if creds, ok := ctx.Value(attemptCredentialsKey{}).(*attemptCredentials); ok {
		o.rejected(creds.password, code)
	}
}

// TraceQueryStart does nothing: pgx's Tracer field must be a QueryTracer.
func (o *authFailureObserver) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd does nothing.
func (o *authFailureObserver) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// iamAuth builds RDS IAM auth tokens. A token is valid for 15 minutes and
// only checked when a connection authenticates, so each connection gets a
// fresh one and a long-lived connection outlives its token harmlessly.
type iamAuth struct {
	endpoint string // host:port, as signed into the token
	region   string
	user     string
	creds    aws.CredentialsProvider
	timeout  time.Duration
	// source names the IAM source in errors.
	source string
}

func (a *iamAuth) token(ctx context.Context) (string, error) {
	// Retrieving credentials may call out (STS, the container endpoint).
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	token, err := auth.BuildAuthToken(ctx, a.endpoint, a.region, a.user, a.creds)
	if err != nil {
		return "", fmt.Errorf("dbpool: build an RDS IAM auth token for user %q at %s in %s (%s): %w", a.user, a.endpoint, a.region, a.source, err)
	}
	return token, nil
}
