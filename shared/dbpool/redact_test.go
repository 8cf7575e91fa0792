package dbpool_test

import (
	"testing"

	"github.com/outboxkit/dispatcher/shared/dbpool"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		// URLs.
		{"postgres://app:s3cret@db:5432/outbox", "postgres://app:xxxxx@db:5432/outbox"},
		{"postgresql://app:s3cret@db/outbox?sslmode=require", "postgresql://app:xxxxx@db/outbox?sslmode=require"},
		{"postgres://app@db/outbox", "postgres://app@db/outbox"},
		{"postgres://db/outbox", "postgres://db/outbox"},
		{"postgres://app:@db/outbox", "postgres://app:@db/outbox"},
		{"postgres://app:p%40ss%2Fw0rd@db/outbox", "postgres://app:xxxxx@db/outbox"},
		{"postgres://app:s3cret@db1:5432,db2:5433/outbox?target_session_attrs=read-write", "postgres://app:xxxxx@db1:5432,db2:5433/outbox?target_session_attrs=read-write"},
		{"postgres://app@db/outbox?password=s3cret&sslmode=require", "postgres://app@db/outbox?password=xxxxx&sslmode=require"},
		{"postgres://app@db/outbox?sslmode=verify-full&sslpassword=keypass", "postgres://app@db/outbox?sslmode=verify-full&sslpassword=xxxxx"},
		{"postgres://app@db/outbox?pass%77ord=s3cret", "postgres://app@db/outbox?pass%77ord=xxxxx"},
		// Malformed URLs are still masked: unescaped '@', '/', '?' in the password.
		{"postgres://app:p@ss@db/outbox", "postgres://app:xxxxx@db/outbox"},
		{"postgres://app:a/b?c@db/outbox", "postgres://app:xxxxx@db/outbox"},
		{"postgres://app:s3cret@db:port/outbox", "postgres://app:xxxxx@db:port/outbox"},
		// An '@' in the query makes the mask too wide, never too narrow.
		{"postgres://app:s3cret@db/outbox?application_name=a:b@c", "postgres://app:xxxxx@c"},
		{"postgres://db/outbox?password=s3cret&application_name=a@b", "postgres://db/outbox?password=xxxxx&application_name=a@b"},
		// Key=value strings.
		{"host=db user=app password=s3cret dbname=outbox", "host=db user=app password=xxxxx dbname=outbox"},
		{"host=db password = s3cret", "host=db password = xxxxx"},
		{"host=db password='s3 cr\\'et' dbname=outbox", "host=db password=xxxxx dbname=outbox"},
		{"password=s3\\ cret host=db", "password=xxxxx host=db"},
		{"host=db sslpassword=keypass", "host=db sslpassword=xxxxx"},
		{"host=db password=", "host=db password="},
		{"host=db user=app", "host=db user=app"},
		{"", ""},
		// Too malformed to find the password in: not shown at all.
		{"host=db password='s3cret", "(connection string not shown: it could not be parsed)"},
		{"host=db s3cret", "(connection string not shown: it could not be parsed)"},
	}
	for _, tt := range tests {
		if got := dbpool.Redact(tt.in); got != tt.want {
			t.Errorf("Redact(%q)\n got %q\nwant %q", tt.in, got, tt.want)
		}
	}
}
