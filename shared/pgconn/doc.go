// Package pgconn builds the PostgreSQL connection pool of the Lambda
// functions and the CLI: once per cold start, from the environment, small,
// and safe to print.
//
//	cfg, err := pgconn.LoadConfig(os.Getenv)   // every problem at once, each naming its variable
//	awsCfg, err := config.LoadDefaultConfig(ctx)
//	pool, err := pgconn.Open(ctx, cfg, pgconn.Deps{AWS: awsCfg, ApplicationName: "outbox-dispatcher/dispatch"})
//
// # Where the credentials come from
//
// Exactly one source; two is an error naming both, none an error naming all
// three.
//
//   - OUTBOX_DATABASE_URL: a PostgreSQL URL or key=value string.
//   - OUTBOX_DB_SECRET_ARN: a Secrets Manager secret in the RDS format
//     ({"username","password","engine","host","port","dbname"}), read at
//     cold start. OUTBOX_DB_HOST, OUTBOX_DB_PORT and OUTBOX_DB_NAME override
//     the secret's host, port and dbname (to go through RDS Proxy, or for an
//     RDS-managed secret that holds only the username and password).
//   - OUTBOX_DB_IAM_AUTH=true with OUTBOX_DB_HOST, OUTBOX_DB_PORT (default
//     5432), OUTBOX_DB_NAME and OUTBOX_DB_USER: RDS IAM authentication. Each
//     new connection gets a fresh auth token, signed with the region and
//     credentials of the AWS configuration passed to Open.
//
// The Secrets Manager and IAM sources default to sslmode=require (a
// password or token crosses the network); IAM refuses anything weaker, as
// RDS does. OUTBOX_DB_SSLMODE=verify-full with OUTBOX_DB_SSLROOTCERT (the
// RDS CA bundle shipped with the function) also checks the server's name.
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
//	OUTBOX_DB_MAX_CONNS                    pool size, 1..100 (2: one invocation at a time, plus one)
//	OUTBOX_DB_SIMPLE_PROTOCOL              true: no prepared statements, so RDS Proxy does not pin sessions
//	OUTBOX_DB_STATEMENT_TIMEOUT            statement_timeout (30s)
//	OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT  idle_in_transaction_session_timeout (10s)
//	OUTBOX_DB_CONNECT_TIMEOUT              each connection attempt and each secret fetch (5s)
//	OUTBOX_DB_SSLMODE                      libpq sslmode; overrides a URL's
//	OUTBOX_DB_SSLROOTCERT                  CA bundle for the secret and IAM sources
//
// Durations are Go durations; booleans are true, false, 1 or 0. The two
// session timeouts and application_name are startup parameters of each
// connection rather than SET statements, which would pin RDS Proxy
// sessions.
//
// # Secrets stay out of output
//
// Config, and the ConnString it holds, print, marshal and log with the
// password replaced by "xxxxx" (see Redact). Configuration errors echo a
// connection string only redacted; errors from Open are scrubbed of every
// password the pool knows, and still unwrap to the driver's *pgconn.PgError
// or the AWS API error for errors.As. Secret values are never quoted: a
// malformed secret is described by its field names and JSON types only.
package pgconn
