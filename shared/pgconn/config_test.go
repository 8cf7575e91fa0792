package pgconn_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/pgconn"
)

// env is a getenv over a map.
func env(vars map[string]string) func(string) string {
	return func(name string) string { return vars[name] }
}

const testARN = "arn:aws:secretsmanager:us-west-2:123456789012:secret:outbox/db-AbCdEf"

func TestLoadConfigURL(t *testing.T) {
	t.Parallel()
	cfg, err := pgconn.LoadConfig(env(map[string]string{
		pgconn.EnvDatabaseURL: "postgres://app@db.internal:5432/outbox",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := pgconn.Config{
		Source:                   pgconn.SourceURL,
		DatabaseURL:              "postgres://app@db.internal:5432/outbox",
		MaxConns:                 2,
		StatementTimeout:         30 * time.Second,
		IdleInTransactionTimeout: 10 * time.Second,
		ConnectTimeout:           5 * time.Second,
	}
	if cfg != want {
		t.Errorf("LoadConfig = %v\nwant %v", cfg, want)
	}
}

func TestLoadConfigSettings(t *testing.T) {
	t.Parallel()
	cfg, err := pgconn.LoadConfig(env(map[string]string{
		pgconn.EnvDatabaseURL:              "host=db.internal dbname=outbox user=app",
		pgconn.EnvMaxConns:                 "7",
		pgconn.EnvSimpleProtocol:           "1",
		pgconn.EnvStatementTimeout:         "1m30s",
		pgconn.EnvIdleInTransactionTimeout: "250ms",
		pgconn.EnvConnectTimeout:           "2s",
		pgconn.EnvSSLMode:                  "verify-full",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConns != 7 || !cfg.SimpleProtocol || cfg.StatementTimeout != 90*time.Second ||
		cfg.IdleInTransactionTimeout != 250*time.Millisecond || cfg.ConnectTimeout != 2*time.Second || cfg.SSLMode != "verify-full" {
		t.Errorf("LoadConfig = %v", cfg)
	}

	cfg, err = pgconn.LoadConfig(env(map[string]string{
		pgconn.EnvDatabaseURL:    "postgres://app@db/outbox",
		pgconn.EnvSimpleProtocol: "false",
	}))
	if err != nil || cfg.SimpleProtocol {
		t.Errorf("OUTBOX_DB_SIMPLE_PROTOCOL=false: SimpleProtocol = %t, err %v", cfg.SimpleProtocol, err)
	}
}

func TestLoadConfigSecretsManager(t *testing.T) {
	t.Parallel()
	cfg, err := pgconn.LoadConfig(env(map[string]string{
		pgconn.EnvSecretARN:    testARN,
		pgconn.EnvHost:         "outbox.proxy-abc.eu-west-1.rds.amazonaws.com",
		pgconn.EnvPort:         "6432",
		pgconn.EnvDatabaseName: "outbox",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source != pgconn.SourceSecretsManager || cfg.SecretARN != testARN ||
		cfg.Host != "outbox.proxy-abc.eu-west-1.rds.amazonaws.com" || cfg.Port != 6432 || cfg.Database != "outbox" {
		t.Errorf("LoadConfig = %v", cfg)
	}
	if cfg.SSLMode != "require" {
		t.Errorf("SSLMode = %q, want the secure default require", cfg.SSLMode)
	}

	// Overrides are optional: the secret may name the server itself.
	cfg, err = pgconn.LoadConfig(env(map[string]string{pgconn.EnvSecretARN: testARN}))
	if err != nil || cfg.Host != "" || cfg.Port != 0 {
		t.Errorf("LoadConfig(ARN only) = %v, %v", cfg, err)
	}
}

func TestLoadConfigIAM(t *testing.T) {
	t.Parallel()
	cfg, err := pgconn.LoadConfig(env(map[string]string{
		pgconn.EnvIAMAuth:      "true",
		pgconn.EnvHost:         "outbox.cluster-abc.eu-west-1.rds.amazonaws.com",
		pgconn.EnvDatabaseName: "outbox",
		pgconn.EnvUser:         "outbox_dispatch",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source != pgconn.SourceIAM || cfg.Port != 5432 || cfg.SSLMode != "require" || cfg.User != "outbox_dispatch" {
		t.Errorf("LoadConfig = %v", cfg)
	}

	cfg, err = pgconn.LoadConfig(env(map[string]string{
		pgconn.EnvIAMAuth:      "1",
		pgconn.EnvHost:         "10.0.3.7",
		pgconn.EnvPort:         "6432",
		pgconn.EnvDatabaseName: "outbox",
		pgconn.EnvUser:         "outbox_dispatch",
		pgconn.EnvSSLMode:      "verify-full",
		pgconn.EnvSSLRootCert:  "/var/task/global-bundle.pem",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Port != 6432 || cfg.SSLMode != "verify-full" || cfg.SSLRootCert != "/var/task/global-bundle.pem" {
		t.Errorf("LoadConfig = %v", cfg)
	}

	// OUTBOX_DB_IAM_AUTH=false is not a source.
	if _, err := pgconn.LoadConfig(env(map[string]string{pgconn.EnvIAMAuth: "false"})); !hasProblem(err, "", "no database configured") {
		t.Errorf("IAM_AUTH=false alone: err = %v, want no source", err)
	}
}

func TestLoadConfigProblems(t *testing.T) {
	t.Parallel()
	url := map[string]string{pgconn.EnvDatabaseURL: "postgres://app@db/outbox"}
	iam := map[string]string{pgconn.EnvIAMAuth: "true", pgconn.EnvHost: "db", pgconn.EnvDatabaseName: "outbox", pgconn.EnvUser: "app"}
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
		{"URL and secret", with(url, pgconn.EnvSecretARN, testARN), [][2]string{{pgconn.EnvDatabaseURL, "conflicts with OUTBOX_DB_SECRET_ARN"}}},
		{"URL and IAM", with(iam, pgconn.EnvDatabaseURL, "postgres://db/x"), [][2]string{{pgconn.EnvDatabaseURL, "conflicts with OUTBOX_DB_IAM_AUTH=true"}}},
		{"secret and IAM", with(iam, pgconn.EnvSecretARN, testARN), [][2]string{{pgconn.EnvSecretARN, "conflicts with OUTBOX_DB_IAM_AUTH=true"}}},
		{"all three", with(iam, pgconn.EnvSecretARN, testARN, pgconn.EnvDatabaseURL, "postgres://db/x"), [][2]string{{pgconn.EnvDatabaseURL, "conflicts with OUTBOX_DB_SECRET_ARN and OUTBOX_DB_IAM_AUTH=true"}}},

		{"max conns 0", with(url, pgconn.EnvMaxConns, "0"), [][2]string{{pgconn.EnvMaxConns, "must be from 1 to 100, got 0"}}},
		{"max conns abc", with(url, pgconn.EnvMaxConns, "abc"), [][2]string{{pgconn.EnvMaxConns, `must be an integer from 1 to 100, got "abc"`}}},
		{"max conns 101", with(url, pgconn.EnvMaxConns, "101"), [][2]string{{pgconn.EnvMaxConns, "got 101"}}},
		{"max conns -1", with(url, pgconn.EnvMaxConns, "-1"), [][2]string{{pgconn.EnvMaxConns, "got -1"}}},

		{"statement timeout without unit", with(url, pgconn.EnvStatementTimeout, "30"), [][2]string{{pgconn.EnvStatementTimeout, `must be a Go duration such as 300ms, 30s or 1m, got "30"`}}},
		{"statement timeout zero", with(url, pgconn.EnvStatementTimeout, "0s"), [][2]string{{pgconn.EnvStatementTimeout, `must be from 1ms to 24h0m0s, got "0s"`}}},
		{"statement timeout too long", with(url, pgconn.EnvStatementTimeout, "25h"), [][2]string{{pgconn.EnvStatementTimeout, `got "25h"`}}},
		{"idle timeout negative", with(url, pgconn.EnvIdleInTransactionTimeout, "-1s"), [][2]string{{pgconn.EnvIdleInTransactionTimeout, `got "-1s"`}}},
		{"idle timeout garbage", with(url, pgconn.EnvIdleInTransactionTimeout, "ten seconds"), [][2]string{{pgconn.EnvIdleInTransactionTimeout, `got "ten seconds"`}}},
		{"connect timeout too long", with(url, pgconn.EnvConnectTimeout, "10m"), [][2]string{{pgconn.EnvConnectTimeout, `must be from 1ms to 5m0s, got "10m"`}}},
		{"connect timeout sub-millisecond", with(url, pgconn.EnvConnectTimeout, "10us"), [][2]string{{pgconn.EnvConnectTimeout, `got "10us"`}}},

		{"IAM auth yes", with(url, pgconn.EnvIAMAuth, "yes"), [][2]string{{pgconn.EnvIAMAuth, `must be true, false, 1 or 0, got "yes"`}}},
		{"simple protocol TRUE", with(url, pgconn.EnvSimpleProtocol, "TRUE"), [][2]string{{pgconn.EnvSimpleProtocol, `got "TRUE"`}}},

		{"IAM without host, name, user", map[string]string{pgconn.EnvIAMAuth: "true"}, [][2]string{
			{pgconn.EnvHost, "is required with OUTBOX_DB_IAM_AUTH=true"},
			{pgconn.EnvDatabaseName, "is required"},
			{pgconn.EnvUser, "is required"},
		}},
		{"IAM without TLS", with(iam, pgconn.EnvSSLMode, "disable"), [][2]string{{pgconn.EnvSSLMode, "RDS refuses IAM authentication without TLS"}}},
		{"IAM with prefer", with(iam, pgconn.EnvSSLMode, "prefer"), [][2]string{{pgconn.EnvSSLMode, `got "prefer"`}}},
		{"IAM with a host list", with(iam, pgconn.EnvHost, "db1,db2"), [][2]string{{pgconn.EnvHost, `must be a host name or IP address, got "db1,db2"`}}},
		{"bad port", with(iam, pgconn.EnvPort, "70000"), [][2]string{{pgconn.EnvPort, `got "70000"`}}},
		{"port zero", with(iam, pgconn.EnvPort, "0"), [][2]string{{pgconn.EnvPort, "from 1 to 65535"}}},
		{"unknown sslmode", with(url, pgconn.EnvSSLMode, "required"), [][2]string{{pgconn.EnvSSLMode, `must be one of disable, allow, prefer, require, verify-ca, verify-full, got "required"`}}},

		{"secret name, not ARN", map[string]string{pgconn.EnvSecretARN: "outbox/db"}, [][2]string{{pgconn.EnvSecretARN, `must be a Secrets Manager secret ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>), got "outbox/db"`}}},
		{"ARN of another service", map[string]string{pgconn.EnvSecretARN: "arn:aws:ssm:us-west-2:123456789012:parameter/db"}, [][2]string{{pgconn.EnvSecretARN, `an ARN of service "ssm"`}}},
		{"ARN without region", map[string]string{pgconn.EnvSecretARN: "arn:aws:secretsmanager::123456789012:secret:db"}, [][2]string{{pgconn.EnvSecretARN, "must name a region"}}},
		{"ARN with short account", map[string]string{pgconn.EnvSecretARN: "arn:aws:secretsmanager:us-west-2:1234:secret:db"}, [][2]string{{pgconn.EnvSecretARN, "12-digit account"}}},
		{"ARN of no secret", map[string]string{pgconn.EnvSecretARN: "arn:aws:secretsmanager:us-west-2:123456789012:secret:"}, [][2]string{{pgconn.EnvSecretARN, "must name a secret"}}},
		{"secret with a user", map[string]string{pgconn.EnvSecretARN: testARN, pgconn.EnvUser: "app"}, [][2]string{{pgconn.EnvUser, "has no effect with OUTBOX_DB_SECRET_ARN: the user comes from the secret"}}},
		{"secret with a bad host override", map[string]string{pgconn.EnvSecretARN: testARN, pgconn.EnvHost: "db host"}, [][2]string{{pgconn.EnvHost, "must be a host name"}}},

		{"URL with host", with(url, pgconn.EnvHost, "db2"), [][2]string{{pgconn.EnvHost, "has no effect with OUTBOX_DATABASE_URL: put it in the connection string"}}},
		{"URL with port, name, user", with(url, pgconn.EnvPort, "5433", pgconn.EnvDatabaseName, "x", pgconn.EnvUser, "y"), [][2]string{
			{pgconn.EnvPort, "has no effect"}, {pgconn.EnvDatabaseName, "has no effect"}, {pgconn.EnvUser, "has no effect"},
		}},
		{"URL with root cert", with(url, pgconn.EnvSSLRootCert, "/ca.pem"), [][2]string{{pgconn.EnvSSLRootCert, "put sslrootcert in the connection string"}}},
		{"malformed URL", map[string]string{pgconn.EnvDatabaseURL: "postgres://app@db:notaport/outbox"}, [][2]string{{pgconn.EnvDatabaseURL, "is not a valid PostgreSQL connection string"}}},
		{"malformed key=value", map[string]string{pgconn.EnvDatabaseURL: "host=db dbname"}, [][2]string{{pgconn.EnvDatabaseURL, "is not a valid PostgreSQL connection string"}}},
		{"URL with bad sslmode override", with(url, pgconn.EnvSSLMode, "nope"), [][2]string{{pgconn.EnvSSLMode, "must be one of"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := pgconn.LoadConfig(env(tt.env))
			if err == nil {
				t.Fatalf("LoadConfig = %v, want an error", cfg)
			}
			if cfg != (pgconn.Config{}) {
				t.Errorf("LoadConfig returned %v with its error, want the zero Config", cfg)
			}
			var ce *pgconn.ConfigError
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

func TestLoadConfigReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	_, err := pgconn.LoadConfig(env(map[string]string{
		pgconn.EnvIAMAuth:          "true",
		pgconn.EnvMaxConns:         "abc",
		pgconn.EnvStatementTimeout: "soon",
		pgconn.EnvSimpleProtocol:   "maybe",
		pgconn.EnvSSLMode:          "disable",
	}))
	for _, variable := range []string{pgconn.EnvMaxConns, pgconn.EnvStatementTimeout, pgconn.EnvSimpleProtocol, pgconn.EnvSSLMode, pgconn.EnvHost, pgconn.EnvDatabaseName, pgconn.EnvUser} {
		if !hasProblem(err, variable, "") {
			t.Errorf("no problem reported for %s in:\n%v", variable, err)
		}
	}
	// Even with the source in conflict, the settings are still checked.
	_, err = pgconn.LoadConfig(env(map[string]string{
		pgconn.EnvDatabaseURL: "postgres://db/x",
		pgconn.EnvSecretARN:   testARN,
		pgconn.EnvMaxConns:    "0",
	}))
	if !hasProblem(err, pgconn.EnvDatabaseURL, "conflicts") || !hasProblem(err, pgconn.EnvMaxConns, "") {
		t.Errorf("conflict and bad max conns not both reported:\n%v", err)
	}
}

// hasProblem reports whether err is a *ConfigError with a problem for the
// variable whose message contains fragment.
func hasProblem(err error, variable, fragment string) bool {
	var ce *pgconn.ConfigError
	if !errors.As(err, &ce) {
		return false
	}
	for _, p := range ce.Problems {
		if p.Variable == variable && strings.Contains(p.Message, fragment) {
			return true
		}
	}
	return false
}

func TestValidateHandBuiltConfig(t *testing.T) {
	t.Parallel()
	// Zero settings take the defaults.
	if err := (pgconn.Config{Source: pgconn.SourceURL, DatabaseURL: "postgres://db/x"}).Validate(); err != nil {
		t.Errorf("minimal hand-built config: %v", err)
	}
	err := (pgconn.Config{Source: pgconn.SourceIAM, Host: "db", MaxConns: 500}).Validate()
	for _, variable := range []string{pgconn.EnvMaxConns, pgconn.EnvDatabaseName, pgconn.EnvUser} {
		if !hasProblem(err, variable, "") {
			t.Errorf("no problem for %s in: %v", variable, err)
		}
	}
	if err := (pgconn.Config{}).Validate(); !hasProblem(err, "", "no database configured") {
		t.Errorf("zero Config: %v", err)
	}
}

// A password in OUTBOX_DATABASE_URL must not come out of an error, a print
// or a log line, whatever the shape of the string around it.
func TestPasswordNeverShown(t *testing.T) {
	t.Parallel()
	const password = "Tr0ub4dor&3-s3cret"
	encoded := "Tr0ub4dor%263-s3cret"
	tests := []struct {
		name string
		env  map[string]string
	}{
		{"valid URL, bad settings", map[string]string{pgconn.EnvDatabaseURL: "postgres://app:" + encoded + "@db:5432/outbox", pgconn.EnvMaxConns: "0", pgconn.EnvHost: "x"}},
		{"URL with a bad port", map[string]string{pgconn.EnvDatabaseURL: "postgres://app:" + encoded + "@db:port/outbox"}},
		{"URL with an unescaped password", map[string]string{pgconn.EnvDatabaseURL: "postgres://app:" + password + "@db:port/outbox"}},
		{"URL with a bad host", map[string]string{pgconn.EnvDatabaseURL: "postgres://app:" + encoded + "@d b/outbox"}},
		{"URL with a password parameter", map[string]string{pgconn.EnvDatabaseURL: "postgres://app@db:x/outbox?password=" + encoded}},
		{"key=value with a bad port", map[string]string{pgconn.EnvDatabaseURL: "host=db port=x user=app password=" + password}},
		{"key=value quoted", map[string]string{pgconn.EnvDatabaseURL: "host=db port=x user=app password='" + password + " with space'"}},
		{"key=value unterminated", map[string]string{pgconn.EnvDatabaseURL: "host=db user=app password='" + password}},
		{"two sources", map[string]string{pgconn.EnvDatabaseURL: "postgres://app:" + encoded + "@db/outbox", pgconn.EnvSecretARN: testARN}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := pgconn.LoadConfig(env(tt.env))
			if err == nil {
				t.Fatal("LoadConfig succeeded, want an error")
			}
			assertNoSecret(t, "error", err.Error(), password, encoded)
		})
	}

	cfg, err := pgconn.LoadConfig(env(map[string]string{pgconn.EnvDatabaseURL: "postgres://app:" + encoded + "@db:5432/outbox?sslmode=require"}))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cfg.DatabaseURL), encoded) {
		t.Fatalf("the config lost the password itself: %s", string(cfg.DatabaseURL))
	}
	var text, jsonLog bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("config", "cfg", cfg, "url", cfg.DatabaseURL)
	slog.New(slog.NewJSONHandler(&jsonLog, nil)).Info("config", "cfg", cfg, "url", cfg.DatabaseURL)
	marshalled, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{
		"fmt.Sprint":        fmt.Sprint(cfg),
		"%v":                fmt.Sprintf("%v", cfg),
		"%+v":               fmt.Sprintf("%+v", cfg),
		"%#v":               fmt.Sprintf("%#v", cfg),
		"%s":                fmt.Sprintf("%s", cfg),
		"%v of a pointer":   fmt.Sprintf("%v", &cfg),
		"%v of the URL":     fmt.Sprintf("%v", cfg.DatabaseURL),
		"%#v of the URL":    fmt.Sprintf("%#v", cfg.DatabaseURL),
		"%+v in a struct":   fmt.Sprintf("%+v", struct{ C pgconn.Config }{cfg}),
		"json.Marshal":      string(marshalled),
		"slog text handler": text.String(),
		"slog JSON handler": jsonLog.String(),
	} {
		assertNoSecret(t, name, out, password, encoded)
		if !strings.Contains(out, "xxxxx") {
			t.Errorf("%s shows no redacted URL: %s", name, out)
		}
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
