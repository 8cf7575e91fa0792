// Package localpg starts a throwaway PostgreSQL cluster from the PostgreSQL
// binaries installed on the machine, for local development when no server is
// running: `outboxctl demo` (make run) uses it as its last resort.
//
// The cluster lives in one directory (outboxctl uses .local/pg), is created
// with initdb on first use and reused afterwards, listens on 127.0.0.1 only,
// on a free port, with trust authentication for user postgres, and is stopped
// by Stop. It is disposable: it runs with fsync off, so a machine crash can
// corrupt it — delete the directory and it is made again.
//
// It is the project's one throwaway-cluster launcher: the fault-injection
// soak (shared/testkit/soak) starts its cluster here too, Durable (a
// restart in immediate mode must find every commit in the WAL), with its
// own server settings, and restarts it with Restart.
//
// PostgreSQL refuses to run as root. When the calling process is root, the
// binaries run as the "postgres" system user (created when missing), which
// then owns the directory.
package localpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// ErrNotInstalled means no initdb and pg_ctl were found.
var ErrNotInstalled = errors.New("localpg: PostgreSQL is not installed (no initdb and pg_ctl on the PATH or in the usual places)")

// InstallHint says how to get PostgreSQL, for the message that follows
// ErrNotInstalled.
const InstallHint = "install PostgreSQL 15 or newer (Debian/Ubuntu: sudo apt-get install postgresql; Fedora: sudo dnf install postgresql-server; macOS: brew install postgresql@16), or point OUTBOX_DATABASE_URL at a server"

// MinVersion is the oldest PostgreSQL major version the outbox runs on.
const MinVersion = 15

// User is the database superuser of a throwaway cluster.
const User = "postgres"

// systemUser runs the binaries when the caller is root.
const systemUser = "postgres"

// Options configure Start.
type Options struct {
	// Dir holds the cluster's data directory (Dir/data) and its log
	// (Dir/postgres.log). Required.
	Dir string
	// BinDir holds initdb, pg_ctl and postgres; empty: FindBinaries.
	BinDir string
	// StartTimeout bounds initdb plus the server's start (default 60s).
	StartTimeout time.Duration
	// Durable keeps PostgreSQL's durability settings (fsync,
	// synchronous_commit, full_page_writes) at their defaults, on; without
	// it they are off, as a demo wants.
	Durable bool
	// MaxConnections is the server's max_connections (default 100).
	MaxConnections int
	// Settings are more server settings, "name=value" each, passed with -c
	// after this package's own.
	Settings []string
	// SystemUser runs the binaries when the caller is root (default
	// postgres; created when missing).
	SystemUser string
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

// Cluster is a running throwaway cluster.
type Cluster struct {
	// URL connects to database postgres as the superuser.
	URL string
	// Port is the TCP port on 127.0.0.1.
	Port int
	// DataDir is the data directory.
	DataDir string
	// Version is the server's major version, from PG_VERSION.
	Version string
	// Initialized is true when Start ran initdb (a first use).
	Initialized bool
	// LogPath is the server's log file.
	LogPath string

	binDir string
	runAs  *syscall.Credential
	user   string // the system user runAs is
}

// FindBinaries returns the directory holding initdb and pg_ctl: the PATH's
// first, else the newest version under the usual installation directories.
func FindBinaries() (string, error) {
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if resolved, err := filepath.EvalSymlinks(initdb); err == nil {
			initdb = resolved
		}
		dir := filepath.Dir(initdb)
		if isFile(filepath.Join(dir, "pg_ctl")) {
			return dir, nil
		}
	}
	var candidates []string
	for _, pattern := range []string{
		"/usr/lib/postgresql/*/bin",                          // Debian, Ubuntu
		"/usr/pgsql-*/bin",                                   // PGDG RPMs
		"/opt/homebrew/opt/postgresql@*/bin",                 // Homebrew, Apple silicon
		"/usr/local/opt/postgresql@*/bin",                    // Homebrew, Intel
		"/Applications/Postgres.app/Contents/Versions/*/bin", // Postgres.app
	} {
		matches, _ := filepath.Glob(pattern)
		candidates = append(candidates, matches...)
	}
	candidates = append(candidates, "/usr/local/pgsql/bin", "/usr/bin")
	var found []string
	for _, dir := range candidates {
		if isFile(filepath.Join(dir, "initdb")) && isFile(filepath.Join(dir, "pg_ctl")) {
			found = append(found, dir)
		}
	}
	if len(found) == 0 {
		return "", ErrNotInstalled
	}
	sort.Slice(found, func(i, j int) bool { return versionOf(found[i]) > versionOf(found[j]) })
	return found[0], nil
}

// versionOf extracts the major version from a path like
// /usr/lib/postgresql/16/bin, for choosing the newest (0 when none).
func versionOf(dir string) int {
	for _, part := range strings.FieldsFunc(dir, func(r rune) bool { return r < '0' || r > '9' }) {
		if n, err := strconv.Atoi(part); err == nil && n >= 9 && n < 100 {
			return n
		}
	}
	return 0
}

// Start initialises the cluster in opts.Dir when it has none (or one from
// another PostgreSQL version), stops a server a previous run left running
// there, and starts it on a free port. Call Stop when done.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("localpg: Options.Dir is required")
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	binDir := opts.BinDir
	if binDir == "" {
		var err error
		if binDir, err = FindBinaries(); err != nil {
			return nil, err
		}
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("localpg: %w", err)
	}
	c := &Cluster{DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, "postgres.log"), binDir: binDir, user: opts.SystemUser}
	if c.user == "" {
		c.user = systemUser
	}
	if os.Geteuid() == 0 {
		if c.runAs, err = nonRootCredential(ctx, c.user); err != nil {
			return nil, err
		}
		if !reachableBy(dir, c.runAs.Uid) {
			return nil, fmt.Errorf("localpg: %s is not reachable by the %s user, who must run PostgreSQL (root may not): choose a directory outside a private home", dir, c.user)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("localpg: %w", err)
	}
	if err := c.chown(dir); err != nil {
		return nil, err
	}

	binVersion, err := c.binaryVersion(ctx)
	if err != nil {
		return nil, err
	}
	if major, _ := strconv.Atoi(binVersion); major < MinVersion {
		return nil, fmt.Errorf("localpg: PostgreSQL %s found in %s; the outbox needs %d or newer: %s", binVersion, binDir, MinVersion, InstallHint)
	}
	if existing, err := os.ReadFile(filepath.Join(c.DataDir, "PG_VERSION")); err == nil {
		if strings.TrimSpace(string(existing)) != binVersion {
			// Made by another PostgreSQL version: it is throwaway, so make it again.
			if err := os.RemoveAll(c.DataDir); err != nil {
				return nil, fmt.Errorf("localpg: remove a cluster of PostgreSQL %s: %w", strings.TrimSpace(string(existing)), err)
			}
		} else if isFile(filepath.Join(c.DataDir, "postmaster.pid")) {
			// Left running (or crashed) by an earlier run; stop it so that
			// this run starts it on a port it knows.
			_, _ = c.pgctl(ctx, "stop", "-D", c.DataDir, "-m", "immediate", "-w")
		}
	}
	if !isFile(filepath.Join(c.DataDir, "PG_VERSION")) {
		if out, err := c.run(ctx, "initdb", "-D", c.DataDir, "-U", User, "--auth=trust", "-E", "UTF8",
			"--locale=C", "--no-sync", "--no-instructions"); err != nil {
			return nil, fmt.Errorf("localpg: initdb: %w: %s", err, lastLines(out, 3))
		}
		c.Initialized = true
	}
	c.Version = binVersion

	c.Port, err = freePort()
	if err != nil {
		return nil, err
	}
	// Only TCP on the loopback: no Unix socket, whose path length and
	// directory permissions vary by machine. fsync is off unless Durable
	// because the cluster is disposable and a demo should measure the
	// outbox, not the laptop's disk.
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = 100
	}
	serverOptions := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c max_connections=%d", c.Port, opts.MaxConnections)
	if !opts.Durable {
		serverOptions += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	}
	for _, setting := range opts.Settings {
		serverOptions += " -c " + setting
	}
	logFile := c.LogPath
	if out, err := c.pgctl(ctx, "start", "-D", c.DataDir, "-l", logFile, "-o", serverOptions, "-w", "-t", strconv.Itoa(int(opts.StartTimeout.Seconds()))); err != nil {
		logTail, _ := os.ReadFile(logFile)
		return nil, fmt.Errorf("localpg: pg_ctl start: %w: %s %s", err, lastLines(out, 2), lastLines(logTail, 3))
	}
	c.URL = fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", User, c.Port)
	return c, nil
}

// Stop stops the server (fast shutdown: sessions are ended) and waits for
// it to exit. The data directory is kept for the next Start.
func (c *Cluster) Stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if out, err := c.pgctl(ctx, "stop", "-D", c.DataDir, "-m", "fast", "-w"); err != nil {
		return fmt.Errorf("localpg: pg_ctl stop: %w: %s", err, lastLines(out, 2))
	}
	return nil
}

// StopImmediate stops every server process at once, without a checkpoint,
// and waits for them to exit: for a cluster about to be deleted.
func (c *Cluster) StopImmediate(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if out, err := c.pgctl(ctx, "stop", "-D", c.DataDir, "-m", "immediate", "-w"); err != nil {
		return fmt.Errorf("localpg: pg_ctl stop: %w: %s", err, lastLines(out, 2))
	}
	return nil
}

// Restart restarts the server in mode (RestartFast or RestartImmediate),
// with the options it was started with, and waits until it accepts
// connections again, for at most five minutes (crash recovery after an
// immediate stop replays the WAL since the last checkpoint). It returns
// how long the server was unavailable.
func (c *Cluster) Restart(ctx context.Context, mode string) (time.Duration, error) {
	start := time.Now()
	out, err := c.pgctl(ctx, "restart", "-D", c.DataDir, "-l", c.LogPath, "-m", mode, "-w", "-t", "300")
	if err != nil {
		logTail, _ := os.ReadFile(c.LogPath)
		return time.Since(start), fmt.Errorf("localpg: pg_ctl restart -m %s: %w: %s %s", mode, err, lastLines(out, 2), lastLines(logTail, 5))
	}
	return time.Since(start), nil
}

// URLFor connects to database as user (trust authentication).
func (c *Cluster) URLFor(user, database string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=5", user, c.Port, database)
}

// Running reports whether the cluster's server is running.
func (c *Cluster) Running(ctx context.Context) bool {
	_, err := c.pgctl(ctx, "status", "-D", c.DataDir)
	return err == nil
}

func (c *Cluster) binaryVersion(ctx context.Context) (string, error) {
	out, err := c.run(ctx, "pg_ctl", "--version")
	if err != nil {
		return "", fmt.Errorf("localpg: %s/pg_ctl --version: %w", c.binDir, err)
	}
	// "pg_ctl (PostgreSQL) 15.8 (Debian 15.8-1.pgdg120+1)" → "15".
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return "", fmt.Errorf("localpg: unexpected pg_ctl --version output %q", out)
	}
	major, _, _ := strings.Cut(fields[2], ".")
	return major, nil
}

func (c *Cluster) pgctl(ctx context.Context, args ...string) ([]byte, error) {
	return c.run(ctx, "pg_ctl", args...)
}

// run runs one of the binaries, as the non-root user when there is one.
func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// The server pg_ctl starts must not share our stdin or die with our
	// process group on ^C: Stop ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.runAs}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if c.runAs != nil {
		cmd.Env = append(cmd.Env, "HOME="+c.DataDir)
	}
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	return out.Bytes(), err
}

func (c *Cluster) chown(dir string) error {
	if c.runAs == nil {
		return nil
	}
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(path, int(c.runAs.Uid), int(c.runAs.Gid)); err != nil {
			return fmt.Errorf("localpg: give %s to the %s user: %w", path, c.user, err)
		}
		return nil
	})
}

// nonRootCredential returns the system user systemUser, creating it when
// missing.
func nonRootCredential(ctx context.Context, systemUser string) (*syscall.Credential, error) {
	u, err := user.Lookup(systemUser)
	if err != nil {
		useradd, lookErr := exec.LookPath("useradd")
		if lookErr != nil {
			return nil, fmt.Errorf("localpg: running as root, PostgreSQL needs a non-root user and there is no %q user nor useradd to create one", systemUser)
		}
		out, runErr := exec.CommandContext(ctx, useradd, "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", systemUser).CombinedOutput()
		if runErr != nil {
			return nil, fmt.Errorf("localpg: create the %s system user: %v: %s", systemUser, runErr, lastLines(out, 1))
		}
		if u, err = user.Lookup(systemUser); err != nil {
			return nil, fmt.Errorf("localpg: %w", err)
		}
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("localpg: uid of %s: %w", systemUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("localpg: gid of %s: %w", systemUser, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// reachableBy reports whether every existing ancestor of dir can be
// traversed by uid (world- or owner-executable), so that a server running
// as uid can open its data directory.
func reachableBy(dir string, uid uint32) bool {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		if info, err := os.Stat(d); err == nil {
			st, ok := info.Sys().(*syscall.Stat_t)
			mode := info.Mode().Perm()
			if mode&0o001 == 0 && !(ok && st.Uid == uid && mode&0o100 != 0) {
				return false
			}
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("localpg: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func isFile(path string) bool {
	info, err := os.Stat(path)
	return err == nil && !info.IsDir()
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}
