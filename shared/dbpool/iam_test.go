package dbpool_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/dbpool"
)

// iamConfig is the IAM source on srv, with cfg's other settings.
func iamConfig(srv testServer, cfg dbpool.Config) dbpool.Config {
	cfg.Source, cfg.Host, cfg.Port, cfg.Database, cfg.User = dbpool.SourceIAM, srv.host, srv.port, srv.db.Name, srv.role
	return cfg
}

// passwordRecorder is a BeforeConnect hook, chained after the package's,
// that records the password each new connection is given.
type passwordRecorder struct {
	mu        sync.Mutex
	passwords []string
}

func (r *passwordRecorder) install(pc *pgxpool.Config) {
	pc.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.passwords = append(r.passwords, cc.Password)
		return nil
	}
}

func (r *passwordRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.passwords...)
}

// The BeforeConnect hook gives each connection an RDS IAM auth token signed
// with the AWS configuration's credentials and region. The local server
// trusts the connection and ignores the token, so the connection proves the
// wiring (TLS required, the token as password), and the token is checked by
// signing the same request again.
func TestIAMAuthTokenPerConnection(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	requireTLS(t, srv.db)
	const (
		accessKey = "AKIDIAMTEST"
		secretKey = "iam-test-secret-key"
	)
	static := credentials.NewStaticCredentialsProvider(accessKey, secretKey, "")
	var retrieved atomic.Int32
	counting := aws.CredentialsProviderFunc(func(ctx context.Context) (aws.Credentials, error) {
		retrieved.Add(1)
		return static.Retrieve(ctx)
	})
	var recorder passwordRecorder
	pool, err := dbpool.Open(context.Background(), iamConfig(srv, dbpool.Config{}), dbpool.Deps{
		AWS:           aws.Config{Region: "eu-west-1", Credentials: counting},
		ConfigurePool: recorder.install,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	// Two connections at once: the one the ping opened, and a new one.
	ctx := context.Background()
	first, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release()
	second, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release()
	var user string
	var tls bool
	if err := second.QueryRow(ctx, "SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&user, &tls); err != nil {
		t.Fatal(err)
	}
	if user != srv.role || !tls {
		t.Errorf("connected as %q with TLS %t, want %q over TLS", user, tls, srv.role)
	}

	tokens := recorder.all()
	if len(tokens) != 2 || int(pool.Stat().NewConnsCount()) != 2 {
		t.Fatalf("%d tokens for %d new connections, want one each for 2", len(tokens), pool.Stat().NewConnsCount())
	}
	if got := retrieved.Load(); got != 2 {
		t.Errorf("credentials retrieved %d times, want once per token (2)", got)
	}
	endpoint := fmt.Sprintf("%s:%d", srv.host, srv.port)
	for _, token := range tokens {
		checkRDSAuthToken(t, token, endpoint, srv.role, "eu-west-1", static)
	}
}

// checkRDSAuthToken checks the token's presigned-URL form and its signature.
func checkRDSAuthToken(t *testing.T, token, endpoint, user, region string, creds aws.CredentialsProvider) {
	t.Helper()
	// The SDK writes host:port?Action=…; older versions wrote host:port/?…
	// Both sign the canonical path "/".
	form := regexp.MustCompile(`^` + regexp.QuoteMeta(endpoint) + `/?\?Action=connect&DBUser=` + regexp.QuoteMeta(url.QueryEscape(user)) + `&X-Amz-Algorithm=AWS4-HMAC-SHA256&`)
	if !form.MatchString(token) {
		t.Fatalf("token %q is not of the form %s/?Action=connect&DBUser=%s&X-Amz-...", token, endpoint, user)
	}
	u, err := url.Parse("https://" + token)
	if err != nil {
		t.Fatalf("token %q: %v", token, err)
	}
	q := u.Query()
	signedAt, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	if err != nil {
		t.Fatalf("token X-Amz-Date %q: %v", q.Get("X-Amz-Date"), err)
	}
	if age := time.Since(signedAt); age < -time.Minute || age > time.Minute {
		t.Errorf("token signed at %s, want now", signedAt)
	}
	wantCredential := fmt.Sprintf("AKIDIAMTEST/%s/%s/rds-db/aws4_request", signedAt.Format("20060102"), region)
	for key, want := range map[string]string{"X-Amz-Credential": wantCredential, "X-Amz-Expires": "900", "X-Amz-SignedHeaders": "host"} {
		if got := q.Get(key); got != want {
			t.Errorf("token %s = %q, want %q", key, got, want)
		}
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(q.Get("X-Amz-Signature")) {
		t.Fatalf("token X-Amz-Signature %q is not a SigV4 signature", q.Get("X-Amz-Signature"))
	}

	// Sign the same request independently; the signatures must agree.
	req, _ := http.NewRequest(http.MethodGet, "https://"+endpoint+"/?Action=connect&DBUser="+url.QueryEscape(user)+"&X-Amz-Expires=900", nil)
	c, _ := creds.Retrieve(context.Background())
	const emptyPayloadHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	signed, _, err := v4.NewSigner().PresignHTTP(context.Background(), c, req, emptyPayloadHash, "rds-db", region, signedAt)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := url.Parse(signed)
	if got := q.Get("X-Amz-Signature"); got != want.Query().Get("X-Amz-Signature") {
		t.Errorf("token signature %s, want %s", got, want.Query().Get("X-Amz-Signature"))
	}
}

func TestIAMAuthErrors(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	// Names name the source in the errors, as the config package's do.
	cfg := iamConfig(srv, dbpool.Config{Names: dbpool.Names{IAM: "DB_IAM_AUTH=true"}})
	static := credentials.NewStaticCredentialsProvider("AKIDIAMTEST", "iam-test-secret-key", "")

	_, err := dbpool.Open(context.Background(), cfg, dbpool.Deps{AWS: aws.Config{Credentials: static}})
	if err == nil || !strings.Contains(err.Error(), "(DB_IAM_AUTH=true) needs an AWS region") {
		t.Errorf("no region: err = %v", err)
	}
	_, err = dbpool.Open(context.Background(), cfg, dbpool.Deps{AWS: aws.Config{Region: "eu-west-1"}})
	if err == nil || !strings.Contains(err.Error(), "needs AWS credentials") {
		t.Errorf("no credentials: err = %v", err)
	}

	_, err = dbpool.Open(context.Background(), iamConfig(srv, dbpool.Config{SSLMode: "verify-full", SSLRootCert: "/nonexistent/global-bundle.pem"}),
		dbpool.Deps{AWS: aws.Config{Region: "eu-west-1", Credentials: static}})
	if err == nil || !strings.Contains(err.Error(), "SSLRootCert: cannot read the CA bundle") {
		t.Errorf("missing CA bundle: err = %v", err)
	}

	expired := errors.New("the security token included in the request is expired")
	failing := aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) { return aws.Credentials{}, expired })
	_, err = dbpool.Open(context.Background(), cfg, dbpool.Deps{AWS: aws.Config{Region: "eu-west-1", Credentials: failing}})
	if !errors.Is(err, expired) {
		t.Fatalf("failing credentials: err = %v, want it to wrap %v", err, expired)
	}
	for _, want := range []string{"build an RDS IAM auth token for user " + strconv.Quote(srv.role), "DB_IAM_AUTH=true"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}
}
