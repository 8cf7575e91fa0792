package dbpool_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/jackc/pgx/v5/pgproto3"
)

// fakeSecretsManager speaks Secrets Manager's JSON 1.1 protocol for
// GetSecretValue, so that the tests drive the real SDK client: request
// signing, serialization and error decoding included.
type fakeSecretsManager struct {
	t   *testing.T
	arn string
	// region is the region the request must be signed for: the ARN's.
	region string
	srv    *httptest.Server

	mu      sync.Mutex
	replies []smReply // served in turn; the last one repeats
	calls   int
}

type smReply struct {
	status int
	body   string
}

// secretReply answers with an RDS secret as SecretString.
func secretReply(version string, secret map[string]any) smReply {
	value, err := json.Marshal(secret)
	if err != nil {
		panic(err)
	}
	return secretStringReply(version, string(value))
}

func secretStringReply(version, value string) smReply {
	body, _ := json.Marshal(map[string]any{
		"ARN":           "set by the server",
		"Name":          "outbox/db",
		"SecretString":  value,
		"VersionId":     version,
		"VersionStages": []string{"AWSCURRENT"},
		"CreatedDate":   float64(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).Unix()),
	})
	return smReply{status: http.StatusOK, body: string(body)}
}

func errorReply(status int, code, message string) smReply {
	body, _ := json.Marshal(map[string]string{"__type": code, "message": message})
	return smReply{status: status, body: string(body)}
}

func newFakeSecretsManager(t *testing.T, arn, region string, replies ...smReply) *fakeSecretsManager {
	f := &fakeSecretsManager{t: t, arn: arn, region: region, replies: replies}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeSecretsManager) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var in struct{ SecretId, VersionStage string }
	problem := ""
	switch {
	case r.Method != http.MethodPost || r.URL.Path != "/":
		problem = fmt.Sprintf("request %s %s, want POST /", r.Method, r.URL.Path)
	case r.Header.Get("X-Amz-Target") != "secretsmanager.GetSecretValue":
		problem = fmt.Sprintf("X-Amz-Target %q", r.Header.Get("X-Amz-Target"))
	case r.Header.Get("Content-Type") != "application/x-amz-json-1.1":
		problem = fmt.Sprintf("Content-Type %q", r.Header.Get("Content-Type"))
	case !strings.Contains(r.Header.Get("Authorization"), "/"+f.region+"/secretsmanager/aws4_request"):
		problem = fmt.Sprintf("Authorization %q not signed for secretsmanager in %s", r.Header.Get("Authorization"), f.region)
	case json.Unmarshal(body, &in) != nil || in.SecretId != f.arn:
		problem = fmt.Sprintf("body %s, want SecretId %s", body, f.arn)
	}
	if problem != "" {
		f.t.Errorf("fake Secrets Manager: %s", problem)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	reply := f.replies[0]
	if len(f.replies) > 1 {
		f.replies = f.replies[1:]
	}
	f.calls++
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.WriteHeader(reply.status)
	_, _ = io.WriteString(w, reply.body)
}

// setReplies replaces the replies, as a rotation would.
func (f *fakeSecretsManager) setReplies(replies ...smReply) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replies = replies
}

func (f *fakeSecretsManager) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// awsConfig is an AWS configuration whose every endpoint is the fake, as
// AWS_ENDPOINT_URL would make it, in a region other than the secret's.
func (f *fakeSecretsManager) awsConfig() aws.Config {
	return aws.Config{
		Region:       "eu-west-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTESTSECRETS", "test-secret-access-key", ""),
		BaseEndpoint: aws.String(f.srv.URL),
	}
}

// passwordGate stands in front of the test PostgreSQL, which trusts every
// local connection and so can never refuse a password. It asks the client
// for a cleartext password and, when it matches the gate's current one,
// replays the startup message to the real server and splices the two
// connections together; otherwise it answers as PostgreSQL does, FATAL
// 28P01. Changing the gate's password is a rotation.
type passwordGate struct {
	t        *testing.T
	upstream string
	ln       net.Listener
	password atomic.Pointer[string]
	accepted atomic.Int32
	refused  atomic.Int32

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startPasswordGate(t *testing.T, upstream, password string) *passwordGate {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &passwordGate{t: t, upstream: upstream, ln: ln}
	g.setPassword(password)
	g.wg.Add(1)
	go g.acceptLoop()
	t.Cleanup(g.close)
	return g
}

func (g *passwordGate) setPassword(p string) { g.password.Store(&p) }

func (g *passwordGate) port() int { return g.ln.Addr().(*net.TCPAddr).Port }

func (g *passwordGate) track(c net.Conn) {
	g.mu.Lock()
	g.conns = append(g.conns, c)
	g.mu.Unlock()
}

func (g *passwordGate) close() {
	g.ln.Close()
	g.mu.Lock()
	for _, c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

func (g *passwordGate) acceptLoop() {
	defer g.wg.Done()
	for {
		conn, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.track(conn)
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.serve(conn)
		}()
	}
}

func (g *passwordGate) serve(client net.Conn) {
	defer client.Close()
	backend := pgproto3.NewBackend(client, client)
	var startup *pgproto3.StartupMessage
	for startup == nil {
		msg, err := backend.ReceiveStartupMessage()
		if err != nil {
			return
		}
		switch m := msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := client.Write([]byte("N")); err != nil {
				return
			}
		case *pgproto3.StartupMessage:
			params := make(map[string]string, len(m.Parameters))
			for k, v := range m.Parameters {
				params[k] = v
			}
			startup = &pgproto3.StartupMessage{ProtocolVersion: m.ProtocolVersion, Parameters: params}
		default:
			return
		}
	}
	backend.Send(&pgproto3.AuthenticationCleartextPassword{})
	if err := backend.Flush(); err != nil {
		return
	}
	if err := backend.SetAuthType(pgproto3.AuthTypeCleartextPassword); err != nil {
		g.t.Errorf("password gate: %v", err)
		return
	}
	msg, err := backend.Receive()
	if err != nil {
		return
	}
	pw, ok := msg.(*pgproto3.PasswordMessage)
	if !ok || pw.Password != *g.password.Load() {
		g.refused.Add(1)
		backend.Send(&pgproto3.ErrorResponse{
			Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "28P01",
			Message: fmt.Sprintf("password authentication failed for user %q", startup.Parameters["user"]),
		})
		_ = backend.Flush()
		return
	}
	g.accepted.Add(1)

	server, err := net.Dial("tcp", g.upstream)
	if err != nil {
		g.t.Errorf("password gate: dial %s: %v", g.upstream, err)
		return
	}
	g.track(server)
	defer server.Close()
	frontend := pgproto3.NewFrontend(server, server)
	frontend.Send(startup)
	if err := frontend.Flush(); err != nil {
		return
	}
	// The server trusts the connection and answers AuthenticationOk, which
	// the client, having sent its password, takes as the gate's answer.
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(client, server)
		client.Close()
		close(done)
	}()
	_, _ = io.Copy(server, client)
	server.Close()
	<-done
}
