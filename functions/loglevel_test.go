package functions_test

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/emftest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// The template lets the operator raise the application log level
// (LogLevel, Lambda's ApplicationLogLevel) to ERROR. Lambda's filter must
// then still let every metric through: OldestPendingAgeAlarm treats
// missing data as breaching.
func TestMetricsSurviveApplicationLogLevelError(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	enqueue(t, db.Pool, 3, func(i int) outbox.Message { return usage(i) })
	fn := start(t, "metrics", env(db, "AWS_LAMBDA_LOG_FORMAT=JSON", "AWS_LAMBDA_LOG_LEVEL=ERROR")...)
	invoke(t, fn, event(t, "metrics-schedule.json"), 20*time.Second, nil)

	// The per-topic document comes after the one the alarms read.
	out := awaitOutput(t, fn, `"Topic":"usage_snapshot"`, 1)
	var written, kept []string
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if !strings.Contains(line, `"_aws"`) {
			continue
		}
		written = append(written, line)
		if emftest.LambdaKeeps([]byte(line), "ERROR") {
			kept = append(kept, line)
		}
	}
	if len(written) < 2 || len(kept) != len(written) {
		t.Fatalf("Lambda's filter keeps %d of the %d EMF documents under ApplicationLogLevel ERROR:\n%s", len(kept), len(written), out)
	}
	var alarmed bool
	for _, d := range emftest.Parse(t, []byte(strings.Join(kept, "\n")+"\n")) {
		if _, ok := d.Metrics["OldestPendingAgeSeconds"]; ok && len(d.Dimensions) == 1 && d.Dimensions["FunctionName"] == "metrics" {
			alarmed = true
		}
	}
	if !alarmed {
		t.Errorf("no OldestPendingAgeSeconds under FunctionName alone reaches CloudWatch: the alarm's metric\n%s", out)
	}
}
