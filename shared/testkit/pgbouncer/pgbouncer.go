// Package pgbouncer runs a real PgBouncer in transaction mode in front of
// the test PostgreSQL (pgtest.URL), for tests of what works behind a
// transaction pooler: one PgBouncer per test, on a free loopback port,
// stopped when the test ends.
//
// Its configuration is PgBouncer's defaults but for what must be set: the
// listening address and port, a wildcard database entry pointing at the
// test server, pool_mode = transaction, and trust authentication of the
// test server's user (PgBouncer still wants the user in an auth file). So a
// test sees what a user of Debian's package with its defaults would:
// unknown startup parameters refused, prepared statements unsupported, no
// session kept between transactions.
//
// PgBouncer refuses to run as root: as root, Start runs it as the postgres
// user (-u postgres). When PgBouncer is not installed the test fails with
// the command that installs it — a pooler test that silently skips proves
// nothing; .ci/run installs it.
package pgbouncer

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// InstallHint is the command that installs PgBouncer on Debian and Ubuntu.
const InstallHint = "apt-get install -y pgbouncer"

// Bouncer is one running PgBouncer.
type Bouncer struct {
	// Addr is where it listens, host:port.
	Addr string

	cmd    *exec.Cmd
	output *syncBuffer
	exited chan struct{}
}

// Start runs a PgBouncer in front of the test server for t, and stops it
// when t ends.
func Start(t testing.TB) *Bouncer {
	t.Helper()
	b, err := StartFor(pgtest.URL())
	if err != nil {
		t.Fatalf("pgbouncer: %v", err)
	}
	t.Cleanup(b.stop)
	return b
}

// URL is dbURL (a pgtest database URL, or any URL of the test server) with
// its host and port replaced by the bouncer's: the same database and user,
// through PgBouncer.
func (b *Bouncer) URL(t testing.TB, dbURL string) string {
	t.Helper()
	through, err := b.through(dbURL)
	if err != nil {
		t.Fatalf("pgbouncer: %v", err)
	}
	return through
}

// Through is dbURL with its host and port replaced by the bouncer's.
func (b *Bouncer) Through(dbURL string) (string, error) { return b.through(dbURL) }

func (b *Bouncer) through(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("parse %q: %w", dbURL, err)
	}
	u.Host = b.Addr
	return u.String(), nil
}

// Output is what PgBouncer logged so far (it logs to stderr).
func (b *Bouncer) Output() string { return b.output.String() }

// StartFor runs a PgBouncer in front of the server of serverURL (its host
// and port), for a program that owns its own server (the soak). Its user,
// and the extra users (trust authentication still wants each in the auth
// file), may log in through it. Stop it with Stop.
func StartFor(serverURL string, users ...string) (*Bouncer, error) {
	binary, err := lookPath()
	if err != nil {
		return nil, err
	}
	server, err := url.Parse(serverURL)
	if err != nil || server.Hostname() == "" {
		return nil, fmt.Errorf("the server must be a postgres:// URL with a host, got %q", serverURL)
	}
	port := server.Port()
	if port == "" {
		port = "5432"
	}
	user := server.User.Username()
	if user == "" {
		user = "postgres"
	}
	listen, err := freePort()
	if err != nil {
		return nil, err
	}

	// Readable by the postgres user when PgBouncer runs as it: a temp
	// dir is 0700.
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
pool_mode = transaction
auth_type = trust
auth_file = %s
`, server.Hostname(), port, listen, filepath.Join(dir, "userlist.txt"))
	files := map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  userlist(append([]string{user}, users...)),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}

	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres"}, args...)
	}
	b := &Bouncer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(listen)), output: &syncBuffer{}, exited: make(chan struct{})}
	b.cmd = exec.Command(binary, args...)
	b.cmd.Stdout, b.cmd.Stderr = b.output, b.output
	b.cmd.Dir = dir
	if err := b.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	go func() {
		_ = b.cmd.Wait()
		os.RemoveAll(dir)
		close(b.exited)
	}()
	if err := b.await(serverURL); err != nil {
		b.stop()
		return nil, err
	}
	return b, nil
}

// lookPath finds pgbouncer on the PATH or where Debian installs it, which
// is not on every user's PATH.
func lookPath() (string, error) {
	if path, err := exec.LookPath("pgbouncer"); err == nil {
		return path, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if _, err := os.Stat(debian); err == nil {
		return debian, nil
	}
	return "", fmt.Errorf("PgBouncer is not installed (no pgbouncer on the PATH or at /usr/sbin): install it with `%s` (.ci/run does)", InstallHint)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startupCeiling bounds the wait for PgBouncer to accept a client: far
// more than it takes, so that only a PgBouncer that cannot start fails.
const startupCeiling = time.Minute

// await waits until a client gets through PgBouncer to the server, or
// PgBouncer exits.
func (b *Bouncer) await(serverURL string) error {
	ctx, cancel := context.WithTimeout(context.Background(), startupCeiling)
	defer cancel()
	through, err := b.through(serverURL)
	if err != nil {
		return err
	}
	var last error
	for {
		conn, err := pgx.Connect(ctx, through)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(context.Background())
			if err == nil {
				return nil
			}
		}
		last = err
		select {
		case <-b.exited:
			return fmt.Errorf("PgBouncer exited at startup:\n%s", b.Output())
		case <-ctx.Done():
			return fmt.Errorf("no client got through PgBouncer at %s within %s: %v\n%s", b.Addr, startupCeiling, last, b.Output())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func userlist(users []string) string {
	var b strings.Builder
	for _, u := range users {
		b.WriteString(strconv.Quote(u) + ` ""` + "\n")
	}
	return b.String()
}

// Stop shuts PgBouncer down and waits for it.
func (b *Bouncer) Stop() { b.stop() }

// stop shuts PgBouncer down (SIGTERM: at once, closing its connections)
// and waits for it.
func (b *Bouncer) stop() {
	select {
	case <-b.exited:
		return
	default:
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
