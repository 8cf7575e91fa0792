package redact_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/telemetry/redact"
)

func TestSensitiveKey(t *testing.T) {
	t.Parallel()
	sensitive := []string{
		"payload", "Payload", "raw_payload", "messagePayload",
		"password", "db_password", "DB_PASSWORD", "PGPASSWORD", "passwd", "pwd",
		"secret", "client_secret", "clientSecret", "signing-secret",
		"token", "lease_token", "LeaseToken", "access_token", "aws_session_token",
		"Authorization", "cookie", "Set-Cookie", "credentials",
		"api_key", "X-Api-Key", "apiKey", "private_key", "AWS_SECRET_ACCESS_KEY", "AWSSecretKey",
	}
	for _, k := range sensitive {
		if !redact.SensitiveKey(k) {
			t.Errorf("SensitiveKey(%q) = false, want true", k)
		}
	}
	// What operators need at 3 a.m. stays: ids, codes, sizes, the names and
	// ARNs of secrets (not their values), counts of LLM tokens.
	allowed := []string{
		"message_id", "id", "code", "error", "error_code", "error_message", "namespace", "topic",
		"payload_bytes", "payloadSize", "secret_arn", "OUTBOX_DB_SECRET_ARN", "signing_secret_env",
		"tokens_in", "token_count", "password_set", "dedupe_key", "ordering_key", "keyword", "",
		"access_key_id", "target_ref",
	}
	for _, k := range allowed {
		if redact.SensitiveKey(k) {
			t.Errorf("SensitiveKey(%q) = true, want false", k)
		}
	}
}

func TestStringRedactsCredentials(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in, want string
	}{
		{
			"failed to connect to postgres://outbox:hunter2@db.internal:5432/outbox?sslmode=require",
			"failed to connect to postgres://outbox:[REDACTED]@db.internal:5432/outbox?sslmode=require",
		},
		{
			// An unencoded '@' in the password must not leak its tail.
			"dial postgresql://app:p@ss@w0rd@10.0.0.1/db: refused",
			"dial postgresql://app:[REDACTED]@10.0.0.1/db: refused",
		},
		{"redis://:hunter2@cache:6379", "redis://:[REDACTED]@cache:6379"},
		{
			"cannot parse `host=db user=app password=hunter2 dbname=outbox`",
			"cannot parse `host=db user=app password=[REDACTED] dbname=outbox`",
		},
		{"host=db password='hunter two' sslmode=disable", "host=db password=[REDACTED] sslmode=disable"},
		{"sslpassword = hunter2", "sslpassword = [REDACTED]"},
		{
			`Post "https://hooks.example.com/in?access_token=abc123&id=7": EOF`,
			`Post "https://hooks.example.com/in?access_token=[REDACTED]&id=7": EOF`,
		},
		{`{"user":"app","password":"hunter2","port":5432}`, `{"user":"app","password":"[REDACTED]","port":5432}`},
		{`body: {\"client_secret\":\"hunter2\",\"ok\":false}`, `body: {\"client_secret\":\"[REDACTED]\",\"ok\":false}`},
		{"Authorization: Bearer eyJhbGciOi.eyJzdWIi.sig", "Authorization: Bearer [REDACTED]"},
		{"Authorization: Basic YXBwOmh1bnRlcjI=", "Authorization: Basic [REDACTED]"},
	}
	for _, tc := range cases {
		if got := redact.String(tc.in); got != tc.want {
			t.Errorf("String(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
		if strings.Contains(redact.String(tc.in), "hunter") {
			t.Errorf("String(%q) leaks the password", tc.in)
		}
	}
}

func TestStringKeepsOrdinaryText(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"",
		"delivered 500 messages to arn:aws:sns:eu-west-1:123456789012:payments.fifo",
		"message 0190a3c4-5d6e-7f80-9a0b-1c2d3e4f5a6b: TARGET_5XX: 503 Service Unavailable",
		"https://billing.internal/usage?id=42",
		"tokens_in=1200 tokens_out=340",
		"basic validation failed: missing tenant_id",
		`{"tokens_in":1200,"namespace":"billing"}`,
		"mailto:ops@example.com",
	} {
		if got := redact.String(s); got != s {
			t.Errorf("String(%q) = %q, want it unchanged", s, got)
		}
	}
}

func TestError(t *testing.T) {
	t.Parallel()
	if got := redact.Error(nil); got != "" {
		t.Fatalf("Error(nil) = %q", got)
	}
	inner := errors.New("dial tcp: lookup db: no such host")
	err := fmt.Errorf("dbpool: connect postgres://svc:s3cr3t-value@db/outbox: %w", inner)
	got := redact.Error(err)
	if strings.Contains(got, "s3cr3t-value") {
		t.Fatalf("Error leaks the password: %q", got)
	}
	if !strings.Contains(got, "no such host") || !strings.Contains(got, "postgres://svc:[REDACTED]@db/outbox") {
		t.Fatalf("Error lost the useful part of the text: %q", got)
	}
}
