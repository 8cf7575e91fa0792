package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/dbpool"
)

// env is an Env over a map.
func env(vars map[string]string) Env {
	return Env{Getenv: func(name string) string { return vars[name] }}
}

func loadDatabase(e Env) (dbpool.Config, error) { return LoadDatabase(e, 0) }

const testARN = "arn:aws:secretsmanager:us-west-2:123456789012:secret:outbox/db-AbCdEf"

func TestLoadDatabaseURL(t *testing.T) {
	t.Parallel()
	cfg, err := loadDatabase(env(map[string]string{
		"OUTBOX_DATABASE_URL": "postgres://app@db.internal:5432/outbox",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := dbpool.Config{
		Source:                   dbpool.SourceURL,
		DatabaseURL:              "postgres://app@db.internal:5432/outbox",
		MaxConns:                 2,
		StatementTimeout:         30 * time.Second,
		IdleInTransactionTimeout: 10 * time.Second,
		ConnectTimeout:           5 * time.Second,
		Pooler:                   dbpool.PoolerNone,
		Names:                    databaseNames,
	}
	if cfg != want {
		t.Errorf("LoadDatabase = %v\nwant %v", cfg, want)
	}
}

func TestLoadDatabaseSettings(t *testing.T) {
	t.Parallel()
	cfg, err := loadDatabase(env(map[string]string{
		"OUTBOX_DATABASE_URL":                   "host=db.internal dbname=outbox user=app",
		"OUTBOX_DB_MAX_CONNS":                   "7",
		"OUTBOX_DB_SIMPLE_PROTOCOL":             "1",
		"OUTBOX_DB_STATEMENT_TIMEOUT":           "1m30s",
		"OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT": "250ms",
		"OUTBOX_DB_CONNECT_TIMEOUT":             "2s",
		"OUTBOX_DB_SSLMODE":                     "verify-full",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConns != 7 || !cfg.SimpleProtocol || cfg.StatementTimeout != 90*time.Second ||
		cfg.IdleInTransactionTimeout != 250*time.Millisecond || cfg.ConnectTimeout != 2*time.Second || cfg.SSLMode != "verify-full" {
		t.Errorf("LoadDatabase = %v", cfg)
	}

	cfg, err = loadDatabase(env(map[string]string{
		"OUTBOX_DATABASE_URL":       "postgres://app@db/outbox",
		"OUTBOX_DB_SIMPLE_PROTOCOL": "false",
	}))
	if err != nil || cfg.SimpleProtocol {
		t.Errorf("OUTBOX_DB_SIMPLE_PROTOCOL=false: SimpleProtocol = %t, err %v", cfg.SimpleProtocol, err)
	}
}

// One setting puts the functions behind a transaction pooler: the simple
// protocol comes with it, and a value that contradicts it is refused
// rather than ignored.
func TestLoadDatabasePooler(t *testing.T) {
	t.Parallel()
	const url = "postgres://app@pgbouncer.internal:6432/outbox"
	cfg, err := loadDatabase(env(map[string]string{"OUTBOX_DATABASE_URL": url, "OUTBOX_DB_POOLER": "transaction"}))
	if err != nil || cfg.Pooler != dbpool.PoolerTransaction || !cfg.SimpleProtocol {
		t.Errorf("OUTBOX_DB_POOLER=transaction: %v, %v; want the pooler and the simple protocol", cfg, err)
	}
	cfg, err = loadDatabase(env(map[string]string{"OUTBOX_DATABASE_URL": url, "OUTBOX_DB_POOLER": "transaction", "OUTBOX_DB_SIMPLE_PROTOCOL": "true"}))
	if err != nil || !cfg.SimpleProtocol {
		t.Errorf("with OUTBOX_DB_SIMPLE_PROTOCOL=true as well: %v, %v", cfg, err)
	}
	_, err = loadDatabase(env(map[string]string{"OUTBOX_DATABASE_URL": url, "OUTBOX_DB_POOLER": "transaction", "OUTBOX_DB_SIMPLE_PROTOCOL": "false"}))
	if !hasProblem(err, "OUTBOX_DB_SIMPLE_PROTOCOL", "OUTBOX_DB_POOLER=transaction sends every query with the simple protocol") {
		t.Errorf("OUTBOX_DB_SIMPLE_PROTOCOL=false behind a transaction pooler: %v", err)
	}
	_, err = loadDatabase(env(map[string]string{"OUTBOX_DATABASE_URL": url, "OUTBOX_DB_POOLER": "session"}))
	if !hasProblem(err, "OUTBOX_DB_POOLER", `must be transaction (a transaction pooler such as PgBouncer's pool_mode = transaction) or none, got "session"`) {
		t.Errorf("OUTBOX_DB_POOLER=session: %v", err)
	}
	cfg, err = loadDatabase(env(map[string]string{"OUTBOX_DATABASE_URL": url, "OUTBOX_DB_POOLER": "none", "OUTBOX_DB_SIMPLE_PROTOCOL": "true"}))
	if err != nil || cfg.Pooler != dbpool.PoolerNone || !cfg.SimpleProtocol {
		t.Errorf("none with the simple protocol (RDS Proxy as before): %v, %v", cfg, err)
	}
}

func TestLoadDatabaseSecretsManager(t *testing.T) {
	t.Parallel()
	cfg, err := loadDatabase(env(map[string]string{
		"OUTBOX_DB_SECRET_ARN": testARN,
		"OUTBOX_DB_HOST":       "outbox.proxy-abc.eu-west-1.rds.amazonaws.com",
		"OUTBOX_DB_PORT":       "6432",
		"OUTBOX_DB_NAME":       "outbox",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source != dbpool.SourceSecretsManager || cfg.SecretARN != testARN ||
		cfg.Host != "outbox.proxy-abc.eu-west-1.rds.amazonaws.com" || cfg.Port != 6432 || cfg.Database != "outbox" {
		t.Errorf("LoadDatabase = %v", cfg)
	}
	if cfg.SSLMode != "require" {
		t.Errorf("SSLMode = %q, want the secure default require", cfg.SSLMode)
	}

	// Overrides are optional: the secret may name the server itself.
	cfg, err = loadDatabase(env(map[string]string{"OUTBOX_DB_SECRET_ARN": testARN}))
	if err != nil || cfg.Host != "" || cfg.Port != 0 {
		t.Errorf("LoadDatabase(ARN only) = %v, %v", cfg, err)
	}
}

func TestLoadDatabaseIAM(t *testing.T) {
	t.Parallel()
	cfg, err := loadDatabase(env(map[string]string{
		"OUTBOX_DB_IAM_AUTH": "true",
		"OUTBOX_DB_HOST":     "outbox.cluster-abc.eu-west-1.rds.amazonaws.com",
		"OUTBOX_DB_NAME":     "outbox",
		"OUTBOX_DB_USER":     "outbox_dispatch",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source != dbpool.SourceIAM || cfg.Port != 5432 || cfg.SSLMode != "require" || cfg.User != "outbox_dispatch" {
		t.Errorf("LoadDatabase = %v", cfg)
	}

	cfg, err = loadDatabase(env(map[string]string{
		"OUTBOX_DB_IAM_AUTH":    "1",
		"OUTBOX_DB_HOST":        "10.0.3.7",
		"OUTBOX_DB_PORT":        "6432",
		"OUTBOX_DB_NAME":        "outbox",
		"OUTBOX_DB_USER":        "outbox_dispatch",
		"OUTBOX_DB_SSLMODE":     "verify-full",
		"OUTBOX_DB_SSLROOTCERT": "/var/task/global-bundle.pem",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Port != 6432 || cfg.SSLMode != "verify-full" || cfg.SSLRootCert != "/var/task/global-bundle.pem" {
		t.Errorf("LoadDatabase = %v", cfg)
	}

	// OUTBOX_DB_IAM_AUTH=false is not a source.
	if _, err := loadDatabase(env(map[string]string{"OUTBOX_DB_IAM_AUTH": "false"})); !hasProblem(err, "", "no database configured") {
		t.Errorf("IAM_AUTH=false alone: err = %v, want no source", err)
	}
}

func TestLoadDatabaseProblems(t *testing.T) {
	t.Parallel()
	url := map[string]string{"OUTBOX_DATABASE_URL": "postgres://app@db/outbox"}
	iam := map[string]string{"OUTBOX_DB_IAM_AUTH": "true", "OUTBOX_DB_HOST": "db", "OUTBOX_DB_NAME": "outbox", "OUTBOX_DB_USER": "app"}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name string
		env  map[string]string
		// want are (variable, message fragment) pairs, one per expected problem.
		want [][2]string
	}{
		{"no source", map[string]string{}, [][2]string{{"", "set OUTBOX_DATABASE_URL (a connection string), or OUTBOX_DB_SECRET_ARN (a Secrets Manager secret in the RDS format), or OUTBOX_DB_IAM_AUTH=true with OUTBOX_DB_HOST, OUTBOX_DB_NAME and OUTBOX_DB_USER"}}},
		{"URL and secret", with(url, "OUTBOX_DB_SECRET_ARN", testARN), [][2]string{{"OUTBOX_DATABASE_URL", "conflicts with OUTBOX_DB_SECRET_ARN"}}},
		{"URL and IAM", with(iam, "OUTBOX_DATABASE_URL", "postgres://db/x"), [][2]string{{"OUTBOX_DATABASE_URL", "conflicts with OUTBOX_DB_IAM_AUTH=true"}}},
		{"secret and IAM", with(iam, "OUTBOX_DB_SECRET_ARN", testARN), [][2]string{{"OUTBOX_DB_SECRET_ARN", "conflicts with OUTBOX_DB_IAM_AUTH=true"}}},
		{"all three", with(iam, "OUTBOX_DB_SECRET_ARN", testARN, "OUTBOX_DATABASE_URL", "postgres://db/x"), [][2]string{{"OUTBOX_DATABASE_URL", "conflicts with OUTBOX_DB_SECRET_ARN and OUTBOX_DB_IAM_AUTH=true"}}},

		{"max conns 0", with(url, "OUTBOX_DB_MAX_CONNS", "0"), [][2]string{{"OUTBOX_DB_MAX_CONNS", "must be from 1 to 100, got 0"}}},
		{"max conns abc", with(url, "OUTBOX_DB_MAX_CONNS", "abc"), [][2]string{{"OUTBOX_DB_MAX_CONNS", `must be an integer from 1 to 100, got "abc"`}}},
		{"max conns 101", with(url, "OUTBOX_DB_MAX_CONNS", "101"), [][2]string{{"OUTBOX_DB_MAX_CONNS", "got 101"}}},
		{"max conns -1", with(url, "OUTBOX_DB_MAX_CONNS", "-1"), [][2]string{{"OUTBOX_DB_MAX_CONNS", "got -1"}}},

		{"statement timeout without unit", with(url, "OUTBOX_DB_STATEMENT_TIMEOUT", "30"), [][2]string{{"OUTBOX_DB_STATEMENT_TIMEOUT", `must be a Go duration such as 300ms, 30s or 1m, got "30"`}}},
		{"statement timeout zero", with(url, "OUTBOX_DB_STATEMENT_TIMEOUT", "0s"), [][2]string{{"OUTBOX_DB_STATEMENT_TIMEOUT", `must be from 1ms to 24h0m0s, got "0s"`}}},
		{"statement timeout too long", with(url, "OUTBOX_DB_STATEMENT_TIMEOUT", "25h"), [][2]string{{"OUTBOX_DB_STATEMENT_TIMEOUT", `got "25h"`}}},
		{"idle timeout negative", with(url, "OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT", "-1s"), [][2]string{{"OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT", `got "-1s"`}}},
		{"idle timeout garbage", with(url, "OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT", "ten seconds"), [][2]string{{"OUTBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT", `got "ten seconds"`}}},
		{"connect timeout too long", with(url, "OUTBOX_DB_CONNECT_TIMEOUT", "10m"), [][2]string{{"OUTBOX_DB_CONNECT_TIMEOUT", `must be from 1ms to 5m0s, got "10m"`}}},
		{"connect timeout sub-millisecond", with(url, "OUTBOX_DB_CONNECT_TIMEOUT", "10us"), [][2]string{{"OUTBOX_DB_CONNECT_TIMEOUT", `got "10us"`}}},

		{"IAM auth yes", with(url, "OUTBOX_DB_IAM_AUTH", "yes"), [][2]string{{"OUTBOX_DB_IAM_AUTH", `must be true, false, 1 or 0, got "yes"`}}},
		{"simple protocol TRUE", with(url, "OUTBOX_DB_SIMPLE_PROTOCOL", "TRUE"), [][2]string{{"OUTBOX_DB_SIMPLE_PROTOCOL", `got "TRUE"`}}},

		{"IAM without host, name, user", map[string]string{"OUTBOX_DB_IAM_AUTH": "true"}, [][2]string{
			{"OUTBOX_DB_HOST", "is required with OUTBOX_DB_IAM_AUTH=true"},
			{"OUTBOX_DB_NAME", "is required"},
			{"OUTBOX_DB_USER", "is required"},
		}},
		{"IAM without TLS", with(iam, "OUTBOX_DB_SSLMODE", "disable"), [][2]string{{"OUTBOX_DB_SSLMODE", "RDS refuses IAM authentication without TLS"}}},
		{"IAM with prefer", with(iam, "OUTBOX_DB_SSLMODE", "prefer"), [][2]string{{"OUTBOX_DB_SSLMODE", `got "prefer"`}}},
		{"IAM with a host list", with(iam, "OUTBOX_DB_HOST", "db1,db2"), [][2]string{{"OUTBOX_DB_HOST", `must be a host name or IP address, got "db1,db2"`}}},
		{"bad port", with(iam, "OUTBOX_DB_PORT", "70000"), [][2]string{{"OUTBOX_DB_PORT", `got "70000"`}}},
		{"port zero", with(iam, "OUTBOX_DB_PORT", "0"), [][2]string{{"OUTBOX_DB_PORT", "from 1 to 65535"}}},
		{"unknown sslmode", with(url, "OUTBOX_DB_SSLMODE", "required"), [][2]string{{"OUTBOX_DB_SSLMODE", `must be one of disable, allow, prefer, require, verify-ca, verify-full, got "required"`}}},

		{"secret name, not ARN", map[string]string{"OUTBOX_DB_SECRET_ARN": "outbox/db"}, [][2]string{{"OUTBOX_DB_SECRET_ARN", `must be a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>), got "outbox/db"`}}},
		{"ARN of another service", map[string]string{"OUTBOX_DB_SECRET_ARN": "arn:aws:ssm:us-west-2:123456789012:parameter/db"}, [][2]string{{"OUTBOX_DB_SECRET_ARN", `an ARN of service "ssm"`}}},
		{"ARN without region", map[string]string{"OUTBOX_DB_SECRET_ARN": "arn:aws:secretsmanager::123456789012:secret:db"}, [][2]string{{"OUTBOX_DB_SECRET_ARN", "must name a region"}}},
		{"ARN with short account", map[string]string{"OUTBOX_DB_SECRET_ARN": "arn:aws:secretsmanager:us-west-2:1234:secret:db"}, [][2]string{{"OUTBOX_DB_SECRET_ARN", "12-digit account"}}},
		{"ARN of no secret", map[string]string{"OUTBOX_DB_SECRET_ARN": "arn:aws:secretsmanager:us-west-2:123456789012:secret:"}, [][2]string{{"OUTBOX_DB_SECRET_ARN", "must name a secret"}}},
		{"secret with a user", map[string]string{"OUTBOX_DB_SECRET_ARN": testARN, "OUTBOX_DB_USER": "app"}, [][2]string{{"OUTBOX_DB_USER", "has no effect with OUTBOX_DB_SECRET_ARN: the user comes from the secret"}}},
		{"secret with a bad host override", map[string]string{"OUTBOX_DB_SECRET_ARN": testARN, "OUTBOX_DB_HOST": "db host"}, [][2]string{{"OUTBOX_DB_HOST", "must be a host name"}}},

		{"URL with host", with(url, "OUTBOX_DB_HOST", "db2"), [][2]string{{"OUTBOX_DB_HOST", "has no effect with OUTBOX_DATABASE_URL: put it in the connection string"}}},
		{"URL with port, name, user", with(url, "OUTBOX_DB_PORT", "5433", "OUTBOX_DB_NAME", "x", "OUTBOX_DB_USER", "y"), [][2]string{
			{"OUTBOX_DB_PORT", "has no effect"}, {"OUTBOX_DB_NAME", "has no effect"}, {"OUTBOX_DB_USER", "has no effect"},
		}},
		{"URL with root cert", with(url, "OUTBOX_DB_SSLROOTCERT", "/ca.pem"), [][2]string{{"OUTBOX_DB_SSLROOTCERT", "put sslrootcert in the connection string"}}},
		{"malformed URL", map[string]string{"OUTBOX_DATABASE_URL": "postgres://app@db:notaport/outbox"}, [][2]string{{"OUTBOX_DATABASE_URL", "is not a valid PostgreSQL connection string"}}},
		{"malformed key=value", map[string]string{"OUTBOX_DATABASE_URL": "host=db dbname"}, [][2]string{{"OUTBOX_DATABASE_URL", "is not a valid PostgreSQL connection string"}}},
		{"URL with bad sslmode override", with(url, "OUTBOX_DB_SSLMODE", "nope"), [][2]string{{"OUTBOX_DB_SSLMODE", "must be one of"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := loadDatabase(env(tt.env))
			if err == nil {
				t.Fatalf("LoadDatabase = %v, want an error", cfg)
			}
			if cfg != (dbpool.Config{}) {
				t.Errorf("LoadDatabase returned %v with its error, want the zero Config", cfg)
			}
			var ce *dbpool.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %T is not a *ConfigError: %v", err, err)
			}
			for _, w := range tt.want {
				if !hasProblem(err, w[0], w[1]) {
					t.Errorf("no problem for %q containing %q in:\n%v", w[0], w[1], err)
				}
				if w[0] != "" && !strings.Contains(err.Error(), w[0]+": ") {
					t.Errorf("error does not name %s:\n%v", w[0], err)
				}
			}
			if len(ce.Problems) != len(tt.want) {
				t.Errorf("%d problems, want %d:\n%v", len(ce.Problems), len(tt.want), err)
			}
		})
	}
}

func TestLoadDatabaseReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	_, err := loadDatabase(env(map[string]string{
		"OUTBOX_DB_IAM_AUTH":          "true",
		"OUTBOX_DB_MAX_CONNS":         "abc",
		"OUTBOX_DB_STATEMENT_TIMEOUT": "soon",
		"OUTBOX_DB_SIMPLE_PROTOCOL":   "maybe",
		"OUTBOX_DB_SSLMODE":           "disable",
	}))
	for _, variable := range []string{"OUTBOX_DB_MAX_CONNS", "OUTBOX_DB_STATEMENT_TIMEOUT", "OUTBOX_DB_SIMPLE_PROTOCOL", "OUTBOX_DB_SSLMODE", "OUTBOX_DB_HOST", "OUTBOX_DB_NAME", "OUTBOX_DB_USER"} {
		if !hasProblem(err, variable, "") {
			t.Errorf("no problem reported for %s in:\n%v", variable, err)
		}
	}
	// Even with the source in conflict, the settings are still checked.
	_, err = loadDatabase(env(map[string]string{
		"OUTBOX_DATABASE_URL":  "postgres://db/x",
		"OUTBOX_DB_SECRET_ARN": testARN,
		"OUTBOX_DB_MAX_CONNS":  "0",
	}))
	if !hasProblem(err, "OUTBOX_DATABASE_URL", "conflicts") || !hasProblem(err, "OUTBOX_DB_MAX_CONNS", "") {
		t.Errorf("conflict and bad max conns not both reported:\n%v", err)
	}
}

// hasProblem reports whether err is a *ConfigError with a problem for the
// variable whose message contains fragment.
func hasProblem(err error, variable, fragment string) bool {
	var ce *dbpool.ConfigError
	if !errors.As(err, &ce) {
		return false
	}
	for _, p := range ce.Problems {
		if p.Field == variable && strings.Contains(p.Message, fragment) {
			return true
		}
	}
	return false
}

// A password in OUTBOX_DATABASE_URL must not come out of an error, whatever
// the shape of the string around it (dbpool's tests cover printing).
func TestDatabasePasswordNeverInAnError(t *testing.T) {
	t.Parallel()
	const password = "Tr0ub4dor&3-s3cret"
	encoded := "Tr0ub4dor%263-s3cret"
	tests := []struct {
		name string
		env  map[string]string
	}{
		{"valid URL, bad settings", map[string]string{"OUTBOX_DATABASE_URL": "postgres://app:" + encoded + "@db:5432/outbox", "OUTBOX_DB_MAX_CONNS": "0", "OUTBOX_DB_HOST": "x"}},
		{"URL with a bad port", map[string]string{"OUTBOX_DATABASE_URL": "postgres://app:" + encoded + "@db:port/outbox"}},
		{"URL with an unescaped password", map[string]string{"OUTBOX_DATABASE_URL": "postgres://app:" + password + "@db:port/outbox"}},
		{"URL with a bad host", map[string]string{"OUTBOX_DATABASE_URL": "postgres://app:" + encoded + "@d b/outbox"}},
		{"URL with a password parameter", map[string]string{"OUTBOX_DATABASE_URL": "postgres://app@db:x/outbox?password=" + encoded}},
		{"key=value with a bad port", map[string]string{"OUTBOX_DATABASE_URL": "host=db port=x user=app password=" + password}},
		{"key=value quoted", map[string]string{"OUTBOX_DATABASE_URL": "host=db port=x user=app password='" + password + " with space'"}},
		{"key=value unterminated", map[string]string{"OUTBOX_DATABASE_URL": "host=db user=app password='" + password}},
		{"two sources", map[string]string{"OUTBOX_DATABASE_URL": "postgres://app:" + encoded + "@db/outbox", "OUTBOX_DB_SECRET_ARN": testARN}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := loadDatabase(env(tt.env))
			if err == nil {
				t.Fatal("LoadDatabase succeeded, want an error")
			}
			assertNoSecret(t, "error", err.Error(), password, encoded)
		})
	}
}

func assertNoSecret(t *testing.T, what, out string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("%s contains the secret %q:\n%s", what, s, out)
		}
	}
}
