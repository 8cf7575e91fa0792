// Package dbpool builds the PostgreSQL connection pool of the Lambda
// functions and the CLI: once per cold start, from a Config, small, and
// safe to print.
//
//	cfg, err := config.LoadDatabase(config.OS(), 0) // from the environment: every problem at once, each naming its variable
//	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
//	pool, err := dbpool.Open(ctx, cfg, dbpool.Deps{AWS: awsCfg, ApplicationName: "outbox-dispatcher/dispatch"})
//
// The config package reads the OUTBOX_DB_* variables (and
// OUTBOX_DATABASE_URL) into a Config, and names each setting after its
// variable in Config.Names, so that Validate's and Open's errors speak of
// the variables; this package never reads the environment.
//
// # Where the credentials come from
//
// Exactly one source; two is an error naming both, none an error naming all
// three.
//
//   - SourceURL, DatabaseURL: a PostgreSQL URL or key=value string.
//   - SourceSecretsManager, SecretARN: a Secrets Manager secret in the RDS
//     format ({"username","password","engine","host","port","dbname"}), read
//     at cold start. Host, Port and Database override the secret's host, port
//     and dbname (to go through RDS Proxy, or for an RDS-managed secret that
//     holds only the username and password).
//   - SourceIAM with Host, Port (default 5432), Database and User: RDS IAM
//     authentication. Each new connection gets a fresh auth token, signed
//     with the region and credentials of the AWS configuration passed to
//     Open.
//
// The Secrets Manager and IAM sources default to sslmode=require (a
// password or token crosses the network); IAM refuses anything weaker, as
// RDS does. SSLMode verify-full with SSLRootCert (the RDS CA bundle shipped
// with the function) also checks the server's name.
//
// # Password rotation
//
// A rotation changes the password in the database, then in the secret.
// Connections already open stay authenticated; the next new one is refused
// (SQLSTATE 28P01, or 28000 when the alternating-users strategy switched
// users). A pgx connect tracer sees that refusal — no pool hook does — and
// marks the cached secret stale, and the next connection attempt fetches it
// once more. The attempt that discovered the rotation fails (the pool
// cannot retry it); the next succeeds without a restart. At cold start the
// ping is retried once for the same reason. Both events are logged, with the
// secret's version ids so that an operator can tell a rotation that landed
// from a password that is simply wrong.
//
// # Settings
//
//	MaxConns                  pool size, 1..MaxMaxConns (DefaultMaxConns: one invocation at a time, plus one)
//	Pooler                    PoolerNone, or PoolerTransaction behind a pooler in transaction mode
//	SimpleProtocol            no prepared statements, so RDS Proxy does not pin sessions
//	StatementTimeout          statement_timeout (DefaultStatementTimeout)
//	IdleInTransactionTimeout  idle_in_transaction_session_timeout (DefaultIdleInTransactionTimeout)
//	ConnectTimeout            each connection attempt and each secret fetch (DefaultConnectTimeout)
//	SSLMode                   libpq sslmode; overrides a URL's
//	SSLRootCert               CA bundle for the secret and IAM sources
//
// The two session timeouts and application_name are startup parameters of
// each connection rather than SET statements, which would pin RDS Proxy
// sessions.
//
// # Behind a transaction pooler
//
// A pooler in transaction mode (PgBouncer's pool_mode = transaction,
// Supavisor) may serve each transaction of a session on another server
// connection, and PgBouncer's defaults refuse the timeouts as startup
// parameters. With PoolerTransaction nothing is left in the session: every
// query goes with the simple protocol, no timeout is a startup parameter,
// and the Pool that Open returns sets them with SET LOCAL in the round trip
// of each statement and at each BEGIN (see Pool). The dispatch function
// does not LISTEN then (package dispatchconfig), and the migrations, which
// hold a session-level advisory lock, refuse it (Config.NeedSession).
//
// # Failover
//
// After a failover a warm function's pooled connections lead to a server
// that is gone, or still there but read-only (a demoted primary, or a
// name that resolves to it until DNS catches up). A statement failing that
// way (IsFailover: SQLSTATE 25006, 57P01-57P03, class 08; or its connection
// closed under it) makes the pool drop every connection, so that the next
// statement connects anew and resolves the host again: pgx looks the host
// up at each connection, and Go's resolver keeps no cache. The statement
// that met the failure still fails; the callers' retries (a completion is
// retried three times) and the next invocation reach the new primary.
//
// # Secrets stay out of output
//
// Config, and the ConnString it holds, print, marshal and log with the
// password replaced by "xxxxx" (see Redact). Configuration errors echo a
// connection string only redacted; errors from Open are scrubbed of every
// password the pool knows, and still unwrap to the driver's *dbpool.PgError
// or the AWS API error for errors.As. Secret values are never quoted: a
// malformed secret is described by its field names and JSON types only.
package dbpool
