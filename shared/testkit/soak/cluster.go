package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Cluster is a throwaway PostgreSQL cluster: initdb into a temporary
// directory, pg_ctl start on a free port, trust authentication on the
// loopback address only. The soak owns it, so it may restart it at will.
type Cluster struct {
	// Port is the port the server listens on (127.0.0.1 only).
	Port int
	// LogPath is the server's log file.
	LogPath string

	bin  string
	dir  string
	data string
	cred *syscall.Credential
}

// Restart modes, as pg_ctl names them.
const (
	// RestartFast is a clean shutdown: sessions are terminated, open
	// transactions rolled back, a checkpoint written (a planned restart, a
	// minor-version upgrade, an RDS reboot without failover).
	RestartFast = "fast"
	// RestartImmediate stops every server process at once, without a
	// checkpoint: the next start runs crash recovery from the WAL (what a
	// crash, an OOM kill or a failover to a replica looks like to clients).
	RestartImmediate = "immediate"
)

// FindPostgres returns the directory of initdb and pg_ctl: $SOAK_PG_BIN,
// else pg_config --bindir, else the newest /usr/lib/postgresql/<v>/bin.
func FindPostgres() (string, error) {
	if dir := os.Getenv("SOAK_PG_BIN"); dir != "" {
		return dir, checkBin(dir)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if checkBin(dir) == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, dir := range matches {
		if versionOf(dir) >= 15 && checkBin(dir) == nil {
			return dir, nil
		}
	}
	return "", errors.New("soak: no PostgreSQL 15+ binaries found: set SOAK_PG_BIN to the directory holding initdb and pg_ctl")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func checkBin(dir string) error {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("soak: %s: %w", name, err)
		}
	}
	return nil
}

// StartCluster initialises and starts a cluster. PostgreSQL refuses to run
// as root, so when the soak runs as root the cluster runs as the operating
// system user $SOAK_PG_USER (default postgres).
func StartCluster(ctx context.Context, bin string) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "outbox-soak-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin, dir: dir, data: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, "server.log")}
	if os.Geteuid() == 0 {
		name := os.Getenv("SOAK_PG_USER")
		if name == "" {
			name = "postgres"
		}
		if c.cred, err = credentialOf(name); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("soak: running as root, PostgreSQL must run as another user: %w (set SOAK_PG_USER)", err)
		}
		if err := chownTree(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := c.run(ctx, "initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		c.Remove()
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			c.Remove()
			return nil, err
		}
		c.Port = port
		conf := strings.Join([]string{
			"",
			"# outbox soak: a throwaway cluster",
			"listen_addresses = '127.0.0.1'",
			fmt.Sprintf("port = %d", port),
			fmt.Sprintf("unix_socket_directories = '%s'", dir),
			"max_connections = 200",
			"shared_buffers = 256MB",
			// Durability settings stay at their defaults (fsync and
			// synchronous_commit on): the soak's promise is about committed
			// transactions, and an immediate restart must find them in the WAL.
			"max_wal_size = 2GB",
			// The launcher visits a database once per naptime (default 1
			// min): with the default, outbox.pending collects a minute of
			// dead rows between vacuums whatever its per-table thresholds,
			// and at a thousand messages a second its claim scan slows
			// down a hundredfold. Deployments need the same (RDS: the
			// parameter group); see docs/RELIABILITY.md.
			"autovacuum_naptime = 5s",
			"checkpoint_timeout = 5min",
			"log_min_messages = warning",
			"log_line_prefix = '%m [%p] %q%u@%d '",
			"",
		}, "\n")
		if err := appendFile(filepath.Join(c.data, "postgresql.conf"), conf); err != nil {
			c.Remove()
			return nil, err
		}
		err = c.run(ctx, "pg_ctl", "-D", c.data, "-l", c.LogPath, "-w", "-t", "120", "start")
		if err == nil {
			return c, nil
		}
		if attempt == 2 {
			c.Remove()
			return nil, fmt.Errorf("%w\n%s", err, c.logTail())
		}
	}
}

// URL is a connection string for database as user.
func (c *Cluster) URL(user, database string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=5", user, c.Port, database)
}

// Restart restarts the server in the given mode (RestartFast or
// RestartImmediate) and waits until it accepts connections again. It
// returns how long the server was unavailable.
func (c *Cluster) Restart(ctx context.Context, mode string) (time.Duration, error) {
	start := time.Now()
	err := c.run(ctx, "pg_ctl", "-D", c.data, "-l", c.LogPath, "-m", mode, "-w", "-t", "300", "restart")
	if err != nil {
		return time.Since(start), fmt.Errorf("%w\n%s", err, c.logTail())
	}
	return time.Since(start), nil
}

// Stop stops the server at once and removes its files (unless
// SOAK_KEEP_CLUSTER is set, for a post-mortem).
func (c *Cluster) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = c.run(ctx, "pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop")
	if os.Getenv("SOAK_KEEP_CLUSTER") != "" {
		return
	}
	c.Remove()
}

// Remove deletes the cluster's directory.
func (c *Cluster) Remove() { os.RemoveAll(c.dir) }

// LogTail is the end of the server log, for error reports.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.LogPath)
	if err != nil {
		return ""
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return "server log:\n" + string(b)
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("soak: %s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return nil
}

func credentialOf(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func chownTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
