package dbpool_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/smithy-go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// testServer is where the test PostgreSQL listens, a fresh database on it,
// and a login role with a password.
type testServer struct {
	db   *pgtest.DB
	host string
	port uint16
	role string
}

// newTestServer creates the database and a login role with password
// "pw-v1". The server trusts local connections, so it ignores the password;
// the rotation tests put a passwordGate in front of it to check passwords.
func newTestServer(t *testing.T) testServer {
	t.Helper()
	db := pgtest.New(t)
	cc, err := pgconn.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	srv := testServer{db: db, host: cc.Host, port: cc.Port, role: "outbox_t_dbpool_" + strings.ToLower(rand.Text()[:12])}
	srv.exec(t, "CREATE ROLE "+pgx.Identifier{srv.role}.Sanitize()+" LOGIN PASSWORD 'pw-v1'")
	// Registered after pgtest.New's cleanup, so it runs before the database
	// is dropped; the role owns nothing and holds no grants, so it drops.
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = db.Pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", srv.role)
		if _, err := db.Pool.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{srv.role}.Sanitize()); err != nil {
			t.Errorf("drop role %s: %v", srv.role, err)
		}
	})
	return srv
}

func (s testServer) exec(t *testing.T, sql string) {
	t.Helper()
	if _, err := s.db.Pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (s testServer) addr() string { return net.JoinHostPort(s.host, strconv.Itoa(int(s.port))) }

// rdsSecret is the secret RDS would keep for the role.
func (s testServer) rdsSecret(password string) map[string]any {
	return map[string]any{"username": s.role, "password": password, "engine": "postgres", "host": s.host, "port": s.port, "dbname": s.db.Name}
}

// logBuffer is a slog JSON logger into a buffer safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// secretConfig is the Secrets Manager source of testARN, with cfg's other
// settings.
func secretConfig(cfg dbpool.Config) dbpool.Config {
	cfg.Source, cfg.SecretARN = dbpool.SourceSecretsManager, testARN
	return cfg
}

func currentUser(t *testing.T, pool *dbpool.Pool) string {
	t.Helper()
	var user string
	if err := pool.QueryRow(context.Background(), "SELECT current_user").Scan(&user); err != nil {
		t.Fatal(err)
	}
	return user
}

// The secret names the server; the pool connects as its user, over TLS by
// default, with the client the package builds from the AWS configuration
// (signed for the ARN's region, us-west-2, not the configuration's).
func TestOpenSecretsManager(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	requireTLS(t, srv.db)
	sm := newFakeSecretsManager(t, testARN, "us-west-2", secretReply("v1", srv.rdsSecret("pw-v1")))

	pool, err := dbpool.Open(context.Background(), secretConfig(dbpool.Config{}), dbpool.Deps{AWS: sm.awsConfig(), ApplicationName: "outbox-dispatcher/reaper"})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := currentUser(t, pool); got != srv.role {
		t.Errorf("current_user = %q, want the secret's %q", got, srv.role)
	}
	var tls bool
	if err := pool.QueryRow(context.Background(), "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&tls); err != nil || !tls {
		t.Errorf("TLS in use = %t (%v), want sslmode=require by default", tls, err)
	}
	if got := show(t, pool, "application_name"); got != "outbox-dispatcher/reaper" {
		t.Errorf("application_name = %q", got)
	}
	if strings.Contains(pool.Config().ConnString(), "pw-v1") {
		t.Errorf("the pool's connection string holds the password: %s", pool.Config().ConnString())
	}
	if sm.Calls() != 1 {
		t.Errorf("GetSecretValue called %d times, want 1", sm.Calls())
	}
}

// Host, Port and Database override the secret, and
// supply what an RDS-managed secret (username and password only) lacks. A
// client passed in Deps is used as it is.
func TestOpenSecretsManagerOverrides(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	overrides := dbpool.Config{Host: srv.host, Port: srv.port, Database: srv.db.Name, SSLMode: "disable"}
	for name, secret := range map[string]map[string]any{
		"secret names another server": {"username": srv.role, "password": "pw", "engine": "aurora-postgresql", "host": "db.example.invalid", "port": "1", "dbname": "elsewhere"},
		"RDS-managed secret":          {"username": srv.role, "password": "pw"},
	} {
		sm := newFakeSecretsManager(t, testARN, "us-west-2", secretReply("v1", secret))
		client := secretsmanager.NewFromConfig(sm.awsConfig(), func(o *secretsmanager.Options) { o.Region = "us-west-2" })
		pool, err := dbpool.Open(context.Background(), secretConfig(overrides), dbpool.Deps{SecretsManager: client})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := currentUser(t, pool); got != srv.role {
			t.Errorf("%s: current_user = %q", name, got)
		}
		pool.Close()
	}
}

// A secret that cannot be used fails Open with an error naming the variable,
// the ARN and the problem — and never a value from the secret.
func TestOpenSecretsManagerErrors(t *testing.T) {
	t.Parallel()
	const (
		password = "hunter2-Sup3rSecret"
		user     = "payments_rw_9f3a"
	)
	tests := []struct {
		name  string
		reply smReply
		cfg   dbpool.Config
		want  []string
		// apiCode is the AWS error code errors.As must still reach.
		apiCode string
	}{
		{name: "not JSON", reply: secretStringReply("v1", password),
			want: []string{"the secret value is not JSON (syntax error at byte 1)"}},
		{name: "a JSON string", reply: secretStringReply("v1", `"`+password+`"`),
			want: []string{"the secret value is not a JSON object"}},
		{name: "missing password", reply: secretReply("v1", map[string]any{"username": user, "host": "db", "dbname": "outbox"}),
			want: []string{`missing "password"`}},
		{name: "missing both", reply: secretReply("v1", map[string]any{"host": "db"}),
			want: []string{`missing "username" and "password"`}},
		{name: "password not a string", reply: secretStringReply("v1", `{"username":"`+user+`","password":12345678901234}`),
			want: []string{`"password" must be a string`}},
		{name: "bad port", reply: secretReply("v1", map[string]any{"username": user, "password": password, "port": "five"}),
			want: []string{`"port" must be a port number`}},
		{name: "MySQL secret", reply: secretReply("v1", map[string]any{"username": user, "password": password, "engine": "mysql", "host": "db", "dbname": "x"}),
			want: []string{`engine is "mysql", not PostgreSQL`}},
		{name: "no host, no dbname", reply: secretReply("v1", map[string]any{"username": user, "password": password}),
			want: []string{`has no "host" (set Host) and no "dbname" (set Database)`}},
		{name: "binary secret", reply: smReply{status: http.StatusOK, body: `{"ARN":"x","SecretBinary":"aHVudGVyMg==","VersionId":"v1"}`},
			want: []string{"has no SecretString"}},
		{name: "access denied", reply: errorReply(http.StatusBadRequest, "AccessDeniedException", "User: arn:aws:sts::123456789012:assumed-role/dispatch is not authorized to perform: secretsmanager:GetSecretValue"),
			want: []string{"fetch the database secret", "AccessDeniedException", "not authorized"}, apiCode: "AccessDeniedException"},
		{name: "no such secret", reply: errorReply(http.StatusBadRequest, "ResourceNotFoundException", "Secrets Manager can't find the specified secret."),
			want: []string{"ResourceNotFoundException"}, apiCode: "ResourceNotFoundException"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sm := newFakeSecretsManager(t, testARN, "us-west-2", tt.reply)
			var logs logBuffer
			pool, err := dbpool.Open(context.Background(), secretConfig(tt.cfg), dbpool.Deps{AWS: sm.awsConfig(), Logger: logs.logger()})
			if err == nil {
				pool.Close()
				t.Fatal("Open succeeded, want an error")
			}
			for _, want := range append([]string{"SecretARN", testARN}, tt.want...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not contain %q:\n%v", want, err)
				}
			}
			assertNoSecret(t, "error", err.Error(), password, "hunter2", user, "12345678901234", "aHVudGVyMg")
			assertNoSecret(t, "logs", logs.String(), password, "hunter2")
			if tt.apiCode != "" {
				var apiErr smithy.APIError
				if !errors.As(err, &apiErr) || apiErr.ErrorCode() != tt.apiCode {
					t.Errorf("errors.As(smithy.APIError) = %v, want code %s", apiErr, tt.apiCode)
				}
			}
		})
	}
}

// rotationFixture is a pool on the secret source whose connections pass the
// password gate, with the gate and the secret on version v1.
type rotationFixture struct {
	srv  testServer
	gate *passwordGate
	sm   *fakeSecretsManager
	logs *logBuffer
	cfg  dbpool.Config
	deps dbpool.Deps
}

func newRotationFixture(t *testing.T, maxConns int) *rotationFixture {
	t.Helper()
	f := &rotationFixture{srv: newTestServer(t), logs: &logBuffer{}}
	f.gate = startPasswordGate(t, f.srv.addr(), "pw-v1")
	f.sm = newFakeSecretsManager(t, testARN, "us-west-2", f.secret("v1", "pw-v1"))
	f.cfg = secretConfig(dbpool.Config{SSLMode: "disable", MaxConns: int32(maxConns)})
	f.deps = dbpool.Deps{AWS: f.sm.awsConfig(), Logger: f.logs.logger()}
	return f
}

// secret points at the gate rather than at the server.
func (f *rotationFixture) secret(version, password string) smReply {
	s := f.srv.rdsSecret(password)
	s["host"], s["port"] = "127.0.0.1", f.gate.port()
	return secretReply(version, s)
}

// rotate does what a rotation does: the database's password changes, then
// the secret's.
func (f *rotationFixture) rotate(t *testing.T) {
	f.srv.exec(t, "ALTER ROLE "+pgx.Identifier{f.srv.role}.Sanitize()+" PASSWORD 'pw-v2'")
	f.gate.setPassword("pw-v2")
	f.sm.setReplies(f.secret("v2", "pw-v2"))
}

func (f *rotationFixture) assertNoPasswordIn(t *testing.T, what, out string) {
	t.Helper()
	assertNoSecret(t, what, out, "pw-v1", "pw-v2")
}

// After a rotation, open connections carry on; the first new connection is
// refused (28P01) and marks the secret stale; the next one fetches it once
// and gets in. No restart, and no fetch that a refusal did not call for.
func TestSecretRotationHealsWithoutRestart(t *testing.T) {
	t.Parallel()
	f := newRotationFixture(t, 2)
	// A tracer of the caller's own must not displace the one that watches
	// for refusals.
	var queries pgtest.QueryCounter
	f.deps.ConfigurePool = func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = &queries }
	ctx := context.Background()
	pool, err := dbpool.Open(ctx, f.cfg, f.deps)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()

	f.rotate(t)

	if _, err := held.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("a connection opened before the rotation: %v", err)
	}
	_, err = pool.Acquire(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
		t.Fatalf("first new connection after the rotation: err = %v, want 28P01", err)
	}
	f.assertNoPasswordIn(t, "error", err.Error())
	if got := f.sm.Calls(); got != 1 {
		t.Fatalf("GetSecretValue called %d times before a connection needed the new secret, want 1", got)
	}

	fresh, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("the connection after the refusal: %v", err)
	}
	var user string
	if err := fresh.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil || user != f.srv.role {
		t.Errorf("current_user = %q, %v", user, err)
	}
	fresh.Release()
	if got := f.sm.Calls(); got != 2 {
		t.Errorf("GetSecretValue called %d times, want 2 (cold start, then once after the refusal)", got)
	}

	// The new secret is cached: more connections fetch nothing.
	held.Release()
	pool.Reset()
	for range 2 {
		if err := pool.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.sm.Calls(); got != 2 {
		t.Errorf("GetSecretValue called %d times after the secret healed, want still 2", got)
	}
	if f.gate.refused.Load() != 1 {
		t.Errorf("gate refused %d connections, want 1", f.gate.refused.Load())
	}
	if !containsSubstring(queries.Queries(), "SELECT current_user") {
		t.Errorf("the caller's tracer saw %q, want the queries run", queries.Queries())
	}

	logs := f.logs.String()
	f.assertNoPasswordIn(t, "logs", logs)
	for _, want := range []string{
		`"msg":"dbpool: the database rejected the credentials from the secret; the next connection fetches the secret again"`,
		`"sqlstate":"28P01"`, `"rejected_version_id":"v1"`, `"version_id":"v2"`, testARN,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs do not contain %s:\n%s", want, logs)
		}
	}
}

// Connections refused together cause one fetch, not one each.
func TestSecretRotationFetchesOnceForConcurrentRefusals(t *testing.T) {
	t.Parallel()
	f := newRotationFixture(t, 6)
	ctx := context.Background()
	pool, err := dbpool.Open(ctx, f.cfg, f.deps)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	f.rotate(t)
	pool.Reset()

	acquireAll := func() (refused int) {
		conns := make([]*pgxpool.Conn, 6)
		errs := make([]error, 6)
		var wg sync.WaitGroup
		for i := range conns {
			wg.Go(func() { conns[i], errs[i] = pool.Acquire(ctx) })
		}
		wg.Wait()
		for i, c := range conns {
			if c != nil {
				c.Release()
			}
			if errs[i] != nil {
				var pgErr *pgconn.PgError
				if !errors.As(errs[i], &pgErr) || pgErr.Code != "28P01" {
					t.Fatalf("acquire: %v, want success or 28P01", errs[i])
				}
				refused++
			}
		}
		return refused
	}
	// Some attempts may already find the stale mark and fetch; any that ran
	// with the old password are refused.
	if acquireAll() == 0 {
		t.Fatal("no connection was refused after the rotation")
	}
	if refused := acquireAll(); refused != 0 {
		t.Fatalf("%d connections refused after the refetch", refused)
	}
	if got := f.sm.Calls(); got != 2 {
		t.Errorf("GetSecretValue called %d times, want 2: one fetch for all the refusals", got)
	}
}

// A cold start that races a rotation (the secret still old, the database
// already new) gets in on the ping's one retry.
func TestSecretColdStartDuringRotation(t *testing.T) {
	t.Parallel()
	f := newRotationFixture(t, 2)
	f.gate.setPassword("pw-v2")
	f.sm.setReplies(f.secret("v1", "pw-v1"), f.secret("v2", "pw-v2"))
	pool, err := dbpool.Open(context.Background(), f.cfg, f.deps)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer pool.Close()
	if got := f.sm.Calls(); got != 2 {
		t.Errorf("GetSecretValue called %d times, want 2", got)
	}
	if got := currentUser(t, pool); got != f.srv.role {
		t.Errorf("current_user = %q", got)
	}
}

// A password that is simply wrong is fetched again once, and then the cold
// start fails: no retry loop against Secrets Manager, an error that keeps its
// SQLSTATE, and a log line saying the secret did not change.
func TestSecretWrongPasswordFailsAfterOneRefetch(t *testing.T) {
	t.Parallel()
	f := newRotationFixture(t, 2)
	f.gate.setPassword("pw-v2")
	_, err := dbpool.Open(context.Background(), f.cfg, f.deps)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
		t.Fatalf("Open: err = %v, want 28P01", err)
	}
	for _, want := range []string{"dbpool: connect to the database", "SecretARN=" + testARN, "user=" + f.srv.role} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}
	f.assertNoPasswordIn(t, "error", err.Error())
	if got := f.sm.Calls(); got != 2 {
		t.Errorf("GetSecretValue called %d times, want 2", got)
	}
	logs := f.logs.String()
	f.assertNoPasswordIn(t, "logs", logs)
	if !strings.Contains(logs, "has not changed: the password in Secrets Manager does not match the database") {
		t.Errorf("no log line saying the refetched secret is the rejected one:\n%s", logs)
	}
}

// A refetch that fails (Secrets Manager unreachable or denying) fails that
// connection with an error naming the secret, and the next connection tries
// the fetch again rather than reusing the rejected password.
func TestSecretRefetchFailureIsRetried(t *testing.T) {
	t.Parallel()
	f := newRotationFixture(t, 2)
	ctx := context.Background()
	pool, err := dbpool.Open(ctx, f.cfg, f.deps)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	f.rotate(t)
	f.sm.setReplies(errorReply(http.StatusBadRequest, "AccessDeniedException", "not authorized"), f.secret("v2", "pw-v2"))
	pool.Reset()

	if err := pool.Ping(ctx); err == nil {
		t.Fatal("ping with the rotated-away password succeeded")
	}
	err = pool.Ping(ctx)
	if err == nil || !strings.Contains(err.Error(), "AccessDeniedException") || !strings.Contains(err.Error(), testARN) {
		t.Fatalf("ping while the refetch is denied: err = %v, want AccessDeniedException naming the secret", err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("ping once the secret can be read: %v", err)
	}
	if got := f.sm.Calls(); got != 3 {
		t.Errorf("GetSecretValue called %d times, want 3", got)
	}
	if got := f.gate.refused.Load(); got != 1 {
		t.Errorf("gate refused %d connections, want 1: the rejected password must not be tried again", got)
	}
}
