package config

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/outboxkit/dispatcher/shared/dbpool"
)

// databaseNames names the database settings in dbpool's messages.
var databaseNames = dbpool.Names{
	DatabaseURL:              "OUTBOX_DATABASE_URL",
	SecretARN:                "OUTBOX_DB_SECRET_ARN",
	IAM:                      "OUTBOX_DB_IAM_AUTH=true",
	Host:                     "OUTBOX_DB_HOST",
	Port:                     "OUTBOX_DB_PORT",
	Database:                 "OUTBOX_DB_NAME",
	User:                     "OUTBOX_DB_USER",
	SSLMode:                  "OUTBOX_DB_SSLMODE",
	SSLRootCert:              "OUTBOX_DB_SSLROOTCERT",
	MaxConns:                 "OUTBOX_DB_MAX_CONNS",
	Pooler:                   "OUTBOX_DB_POOLER",
	StatementTimeout:         "OUTBOX_DB_STATEMENT_TIMEOUT",
	IdleInTransactionTimeout: "OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT",
	ConnectTimeout:           "OUTBOX_DB_CONNECT_TIMEOUT",
}

// LoadDatabase reads the database variables and validates them. poolSize,
// when positive, is the pool size unless OUTBOX_DB_MAX_CONNS says otherwise
// (for outboxctl's commands that use many connections). An empty variable
// counts as unset. The error, a *dbpool.ConfigError, lists every problem
// at once, each naming its variable; it never contains the password of a
// connection string.
func LoadDatabase(env Env, poolSize int32) (dbpool.Config, error) {
	getenv := env.getenv()
	var ps []dbpool.Problem
	fail := func(name, format string, args ...any) {
		ps = append(ps, dbpool.Problem{Field: name, Message: fmt.Sprintf(format, args...)})
	}
	cfg := dbpool.Config{
		DatabaseURL: dbpool.ConnString(getenv("OUTBOX_DATABASE_URL")),
		SecretARN:   getenv("OUTBOX_DB_SECRET_ARN"),
		Host:        getenv("OUTBOX_DB_HOST"),
		Database:    getenv("OUTBOX_DB_NAME"),
		User:        getenv("OUTBOX_DB_USER"),
		SSLMode:     getenv("OUTBOX_DB_SSLMODE"),
		SSLRootCert: getenv("OUTBOX_DB_SSLROOTCERT"),
		Names:       databaseNames,
	}
	if env.DatabaseURLSetting != "" {
		cfg.Names.DatabaseURL = env.DatabaseURLSetting
	}
	iam := databaseBool(getenv, "OUTBOX_DB_IAM_AUTH", fail)
	// dbpool checks the value, naming the variable; transaction implies the
	// simple protocol, which an explicit false contradicts.
	cfg.Pooler = dbpool.Pooler(getenv("OUTBOX_DB_POOLER"))
	cfg.SimpleProtocol = databaseBool(getenv, "OUTBOX_DB_SIMPLE_PROTOCOL", fail)
	if cfg.Pooler == dbpool.PoolerTransaction && getenv("OUTBOX_DB_SIMPLE_PROTOCOL") != "" && !cfg.SimpleProtocol {
		fail("OUTBOX_DB_SIMPLE_PROTOCOL", "is %s, but OUTBOX_DB_POOLER=transaction sends every query with the simple protocol (a transaction pooler cannot keep prepared statements, and the timeouts travel in one simple query with each statement): unset it",
			dbpool.QuoteValue(getenv("OUTBOX_DB_SIMPLE_PROTOCOL")))
	}
	if raw := getenv("OUTBOX_DB_PORT"); raw != "" {
		v := mustLookup("OUTBOX_DB_PORT")
		n, err := strconv.ParseUint(raw, 10, 64)
		if err != nil || int64(n) < v.min || int64(n) > v.max {
			fail(v.Name, "must be a port number from %d to %d, got %s", v.min, v.max, dbpool.QuoteValue(raw))
		} else {
			cfg.Port = uint16(n)
		}
	}
	if raw := getenv("OUTBOX_DB_MAX_CONNS"); raw != "" {
		v := mustLookup("OUTBOX_DB_MAX_CONNS")
		n, err := strconv.ParseInt(raw, 10, 32)
		switch {
		case err != nil:
			fail(v.Name, "must be an integer from %d to %d, got %s", v.min, v.max, dbpool.QuoteValue(raw))
		case n < v.min || n > v.max:
			fail(v.Name, "must be from %d to %d, got %d", v.min, v.max, n)
		default:
			cfg.MaxConns = int32(n)
		}
	} else if poolSize > 0 {
		cfg.MaxConns = poolSize
	}
	cfg.StatementTimeout = databaseDuration(getenv, "OUTBOX_DB_STATEMENT_TIMEOUT", fail)
	cfg.IdleInTransactionTimeout = databaseDuration(getenv, "OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT", fail)
	cfg.ConnectTimeout = databaseDuration(getenv, "OUTBOX_DB_CONNECT_TIMEOUT", fail)

	// The source; dbpool reports none, or more than one.
	if cfg.DatabaseURL != "" {
		cfg.Source = dbpool.SourceURL
	}
	if cfg.SecretARN != "" {
		cfg.Source = dbpool.SourceSecretsManager
	}
	if iam {
		cfg.Source = dbpool.SourceIAM
	}
	if ce, ok := errors.AsType[*dbpool.ConfigError](cfg.Validate()); ok {
		ps = append(ps, ce.Problems...)
	}
	if len(ps) > 0 {
		return dbpool.Config{}, dbpool.NewConfigError(ps)
	}
	return cfg.WithDefaults(), nil
}

// DatabaseConfigured reports whether any database source is set.
func DatabaseConfigured(env Env) bool {
	getenv := env.getenv()
	return getenv("OUTBOX_DATABASE_URL") != "" || getenv("OUTBOX_DB_SECRET_ARN") != "" || getenv("OUTBOX_DB_IAM_AUTH") != ""
}

// DatabaseURL is OUTBOX_DATABASE_URL, for the commands that need a
// connection string (migrations).
func DatabaseURL(env Env) string { return env.getenv()("OUTBOX_DATABASE_URL") }

// databaseBool accepts exactly true, false, 1 and 0: a typo such as "ture"
// or "yes" must fail the cold start, not quietly mean false.
func databaseBool(getenv func(string) string, name string, fail func(string, string, ...any)) bool {
	switch raw := getenv(name); raw {
	case "", "false", "0":
		return false
	case "true", "1":
		return true
	default:
		fail(name, "must be true, false, 1 or 0, got %s", dbpool.QuoteValue(raw))
		return false
	}
}

// databaseDuration returns 0 (the default) when the variable is unset or
// bad.
func databaseDuration(getenv func(string) string, name string, fail func(string, string, ...any)) time.Duration {
	raw := getenv(name)
	if raw == "" {
		return 0
	}
	v := mustLookup(name)
	d, err := time.ParseDuration(raw)
	if err != nil {
		fail(name, "must be a Go duration such as 300ms, 30s or 1m, got %s", dbpool.QuoteValue(raw))
		return 0
	}
	if lo, hi := time.Duration(v.min), time.Duration(v.max); d < lo || d > hi {
		fail(name, "must be from %s to %s, got %s", lo, hi, dbpool.QuoteValue(raw))
		return 0
	}
	return d
}
