package soak

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/outboxkit/dispatcher/shared/localpg"
)

// Cluster is a throwaway PostgreSQL cluster, started by the project's one
// launcher (shared/localpg) in a temporary directory: 127.0.0.1 only,
// trust authentication. The soak owns it, so it may restart it at will.
type Cluster struct {
	*localpg.Cluster
	dir string
}

// Restart modes, as pg_ctl names them.
const (
	RestartFast      = localpg.RestartFast
	RestartImmediate = localpg.RestartImmediate
)

// FindPostgres returns the directory of initdb and pg_ctl: $SOAK_PG_BIN,
// else where localpg finds them (the PATH, then the usual installation
// directories, the newest version first).
func FindPostgres() (string, error) {
	if dir := os.Getenv("SOAK_PG_BIN"); dir != "" {
		return dir, nil
	}
	dir, err := localpg.FindBinaries()
	if err != nil {
		return "", fmt.Errorf("soak: %w: set SOAK_PG_BIN to the directory holding initdb and pg_ctl", err)
	}
	return dir, nil
}

// serverSettings are the soak's own, on top of localpg's.
var serverSettings = []string{
	"shared_buffers=256MB",
	"max_wal_size=2GB",
	// The launcher visits a database once per naptime (default 1 min):
	// with the default, outbox.pending collects a minute of dead rows
	// between vacuums whatever its per-table thresholds, and at a thousand
	// messages a second its claim scan slows down a hundredfold.
	// Deployments need the same (RDS: the parameter group); see
	// docs/RELIABILITY.md.
	"autovacuum_naptime=5s",
	"checkpoint_timeout=5min",
	"log_min_messages=warning",
	"log_line_prefix='%m [%p] %q%u@%d '",
}

// StartCluster initialises and starts a cluster in a temporary directory.
// Durability settings stay at their defaults (fsync and synchronous_commit
// on): the soak's promise is about committed transactions, and an
// immediate restart must find them in the WAL. PostgreSQL refuses to run
// as root, so when the soak runs as root the cluster runs as the operating
// system user $SOAK_PG_USER (default postgres).
func StartCluster(ctx context.Context, bin string) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "outbox-soak-pg-")
	if err != nil {
		return nil, err
	}
	// MkdirTemp makes it 0700; localpg gives it to the server's user.
	c, err := localpg.Start(ctx, localpg.Options{
		Dir: dir, BinDir: bin, StartTimeout: 2 * time.Minute,
		Durable: true, MaxConnections: 200, Settings: serverSettings,
		SystemUser: os.Getenv("SOAK_PG_USER"),
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("soak: %w", err)
	}
	return &Cluster{Cluster: c, dir: dir}, nil
}

// URL is a connection string for database as user.
func (c *Cluster) URL(user, database string) string { return c.URLFor(user, database) }

// Stop stops the server at once and removes its files (unless
// SOAK_KEEP_CLUSTER is set, for a post-mortem).
func (c *Cluster) Stop() {
	_ = c.StopImmediate(context.Background())
	if os.Getenv("SOAK_KEEP_CLUSTER") != "" {
		return
	}
	os.RemoveAll(c.dir)
}
