package functions_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// Lambda ends an execution environment with SIGTERM, when the runtime
// registered an extension, and SIGKILL a moment later. On SIGTERM each
// function closes its pool: PostgreSQL sees every session end with a
// Terminate message — none abandoned, as a dropped connection would be —
// and the process exits 0.
func TestShutdownClosesThePool(t *testing.T) {
	t.Parallel()
	for name, file := range map[string]string{
		"dispatch": "dispatch-schedule.json", "reaper": "reaper-schedule.json",
		"metrics": "metrics-schedule.json", "dlq-replay": "dlq-replay-dry-run.json", "migrate": "migrate-status.json",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			var extra []string
			if name == "dispatch" {
				extra = append(extra, "OUTBOX_ROUTES="+newSink(t).routes())
			}
			fn := start(t, name, env(db, extra...)...)
			invoke(t, fn, event(t, file), 30*time.Second, nil)

			const sessions = `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`
			app := "outbox-dispatcher/" + name
			if count(t, db.Pool, sessions, app) == 0 {
				t.Fatalf("no session of %s after its invocation: the test would prove nothing", app)
			}
			if len(fn.Extensions()) == 0 {
				t.Error("the runtime registered no extension: Lambda would end the environment with SIGKILL alone")
			}

			fn.Shutdown(30 * time.Second)
			if exited, err := fn.Exited(); !exited || err != nil {
				t.Errorf("after SIGTERM the process exited %v with %v, want exit status 0\nstderr: %s", exited, err, fn.Stderr())
			}
			// A session's statistics are flushed before it leaves
			// pg_stat_activity.
			for deadline := time.Now().Add(30 * time.Second); count(t, db.Pool, sessions, app) > 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("sessions of %s still open 30s after the process ended", app)
				}
			}
			var abandoned, killed, fatal int64
			err := db.Pool.QueryRow(context.Background(), `SELECT sessions_abandoned, sessions_killed, sessions_fatal
				FROM pg_stat_database WHERE datname = current_database()`).Scan(&abandoned, &killed, &fatal)
			if err != nil {
				t.Fatal(err)
			}
			if abandoned+killed+fatal != 0 {
				t.Errorf("sessions ended abandoned %d, killed %d, fatal %d: the pool was not closed", abandoned, killed, fatal)
			}
		})
	}
}
