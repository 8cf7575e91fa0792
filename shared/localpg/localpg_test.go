package localpg_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/localpg"
)

// TestStartUseStop starts a real throwaway cluster, uses it, stops it, and
// starts it again from the same directory without a second initdb.
func TestStartUseStop(t *testing.T) {
	t.Parallel()
	if _, err := localpg.FindBinaries(); err != nil {
		// The machine this project is built on has PostgreSQL; a laptop
		// without it cannot run this test, and says why.
		t.Skipf("no PostgreSQL binaries: %v", err)
	}
	// Not t.TempDir: under root the server runs as the postgres user, who
	// must be able to reach the directory; /tmp is world-traversable.
	dir, err := os.MkdirTemp("", "localpg-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	first, err := localpg.Start(ctx, localpg.Options{Dir: filepath.Join(dir, "pg")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Stop(context.Background()) })
	if !first.Initialized {
		t.Error("a new directory was not initialised")
	}
	query(t, first.URL, "SELECT current_user")
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if first.Running(ctx) {
		t.Fatal("the server still runs after Stop")
	}
	if conn, err := pgx.Connect(ctx, first.URL+"&connect_timeout=2"); err == nil {
		conn.Close(ctx)
		t.Fatal("the stopped server still accepts connections")
	}

	second, err := localpg.Start(ctx, localpg.Options{Dir: filepath.Join(dir, "pg")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Stop(context.Background()) })
	if second.Initialized {
		t.Error("the existing cluster was initialised again")
	}
	if v := query(t, second.URL, "SHOW server_version_num"); len(v) < 6 || v < "150000" {
		t.Errorf("server_version_num %s, want 15 or newer", v)
	}
	if err := second.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStartWithoutBinaries(t *testing.T) {
	t.Parallel()
	_, err := localpg.Start(context.Background(), localpg.Options{Dir: t.TempDir(), BinDir: t.TempDir()})
	if err == nil {
		t.Fatal("started a cluster from an empty bin directory")
	}
}

func query(t *testing.T, url, sql string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	var out string
	if err := conn.QueryRow(ctx, sql).Scan(&out); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

// A Durable cluster (what the soak starts) keeps fsync on, takes its extra
// settings, and still has a committed row after an immediate restart, which
// is a crash to the server: recovery replays the WAL. The restart keeps the
// options the cluster was started with.
func TestDurableClusterSurvivesAnImmediateRestart(t *testing.T) {
	t.Parallel()
	if _, err := localpg.FindBinaries(); err != nil {
		t.Skipf("no PostgreSQL binaries: %v", err)
	}
	dir, err := os.MkdirTemp("", "localpg-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := localpg.Start(ctx, localpg.Options{Dir: dir, Durable: true, MaxConnections: 42,
		Settings: []string{"autovacuum_naptime=7s", "log_line_prefix='%m [%p] '"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.StopImmediate(context.Background()) })
	url := c.URLFor(localpg.User, "postgres")
	for setting, want := range map[string]string{"fsync": "on", "synchronous_commit": "on", "max_connections": "42", "autovacuum_naptime": "7s", "log_line_prefix": "%m [%p] "} {
		if got := query(t, url, "SHOW "+setting); got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, "CREATE TABLE kept AS SELECT 'committed'::text AS v")
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Restart(ctx, localpg.RestartImmediate); err != nil {
		t.Fatal(err)
	}
	if got := query(t, url, "SELECT v FROM kept"); got != "committed" {
		t.Errorf("after an immediate restart the committed row reads %q", got)
	}
	if got := query(t, url, "SHOW autovacuum_naptime"); got != "7s" {
		t.Errorf("after the restart autovacuum_naptime = %q, want the start's 7s", got)
	}
}
