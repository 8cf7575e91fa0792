package dbpool_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/dbpool"
)

const testARN = "arn:aws:secretsmanager:us-west-2:123456789012:secret:outbox/db-AbCdEf"

func TestValidateHandBuiltConfig(t *testing.T) {
	t.Parallel()
	// Zero settings take the defaults.
	if err := (dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: "postgres://db/x"}).Validate(); err != nil {
		t.Errorf("minimal hand-built config: %v", err)
	}
	err := (dbpool.Config{Source: dbpool.SourceIAM, Host: "db", MaxConns: 500}).Validate()
	for _, variable := range []string{"MaxConns", "Database", "User"} {
		if !hasProblem(err, variable, "") {
			t.Errorf("no problem for %s in: %v", variable, err)
		}
	}
	if err := (dbpool.Config{}).Validate(); !hasProblem(err, "", "no database configured") {
		t.Errorf("zero Config: %v", err)
	}
}

// Validate names each setting by Names: the config package gives the
// environment variables' names.
func TestProblemsNameTheSettingsByNames(t *testing.T) {
	t.Parallel()
	names := dbpool.Names{DatabaseURL: "DB_URL", SecretARN: "DB_SECRET", IAM: "DB_IAM=yes", Database: "DB_NAME", User: "DB_USER", MaxConns: "DB_POOL"}
	err := (dbpool.Config{Source: dbpool.SourceIAM, Host: "db", MaxConns: 500, Names: names}).Validate()
	for _, p := range [][2]string{{"DB_POOL", "must be from 1 to 100"}, {"DB_NAME", "is required with DB_IAM=yes"}, {"DB_USER", "is required with DB_IAM=yes"}} {
		if !hasProblem(err, p[0], p[1]) {
			t.Errorf("no problem for %s with %q in: %v", p[0], p[1], err)
		}
	}
	err = (dbpool.Config{Source: dbpool.SourceSecretsManager, SecretARN: testARN, DatabaseURL: "postgres://db/x", Names: names}).Validate()
	if !hasProblem(err, "DB_URL", "conflicts with DB_SECRET: set exactly one database source") {
		t.Errorf("two sources: %v", err)
	}
	err = (dbpool.Config{Names: names}).Validate()
	if !hasProblem(err, "", "set DB_URL (a connection string), or DB_SECRET (a Secrets Manager secret in the RDS format), or DB_IAM=yes with Host, DB_NAME and DB_USER") {
		t.Errorf("no source: %v", err)
	}
}

// A URL of another scheme (a typo, another database's) is named as such,
// not as key=value pairs that cannot be tokenized; a key=value string
// holding "://" in a value is still read as one.
func TestAURLOfAnotherSchemeIsNamed(t *testing.T) {
	t.Parallel()
	for conn, want := range map[string]string{
		"postgress://foo":         "is not a PostgreSQL URL: its scheme is postgress://, want postgres:// or postgresql://",
		"mysql://u:secret@db/app": "its scheme is mysql://",
		"POSTGRESQL://db/x":       "its scheme is POSTGRESQL://",
	} {
		err := (dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: dbpool.ConnString(conn)}).Validate()
		if !hasProblem(err, "DatabaseURL", want) || strings.Contains(fmt.Sprint(err), "secret") {
			t.Errorf("%s: %v, want %q without the password", conn, err, want)
		}
	}
	for _, conn := range []string{"postgres://db/x", "postgresql://db/x", "host=db dbname=x options='-c search_path=a://b'"} {
		if err := (dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: dbpool.ConnString(conn)}).Validate(); err != nil {
			t.Errorf("%s: %v", conn, err)
		}
	}
}

// hasProblem reports whether err is a *ConfigError with a problem for the
// setting whose message contains fragment.
func hasProblem(err error, setting, fragment string) bool {
	var ce *dbpool.ConfigError
	if !errors.As(err, &ce) {
		return false
	}
	for _, p := range ce.Problems {
		if p.Field == setting && strings.Contains(p.Message, fragment) {
			return true
		}
	}
	return false
}

// A password in a connection string must not come out of a print, a
// marshalling or a log line.
func TestPasswordNeverShown(t *testing.T) {
	t.Parallel()
	const password = "Tr0ub4dor&3-s3cret"
	encoded := "Tr0ub4dor%263-s3cret"
	cfg := dbpool.Config{Source: dbpool.SourceURL, DatabaseURL: dbpool.ConnString("postgres://app:" + encoded + "@db:5432/outbox?sslmode=require")}.WithDefaults()
	if err := cfg.Validate(); err != nil {
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
		"%+v in a struct":   fmt.Sprintf("%+v", struct{ C dbpool.Config }{cfg}),
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
