// Package moto starts moto_server, an AWS emulator, for tests that prove real
// aws-sdk-go-v2 calls deliver: SNS → SQS subscriptions, EventBridge rule →
// SQS. One server per test binary, on a free loopback port, stopped when the
// binary exits; tests isolate themselves by unique resource names.
//
// When moto_server is not on the PATH, Start skips the test with a message
// naming what was not checked.
package moto

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// Region is the region the emulator's resources live in.
const Region = "us-east-1"

// AccountID is moto's default account.
const AccountID = "123456789012"

// Server is a running moto_server.
type Server struct {
	// URL is its endpoint, e.g. http://127.0.0.1:41234.
	URL string
}

var (
	once    sync.Once
	shared  *Server
	failure error
	cmd     *exec.Cmd
)

// Start returns the test binary's moto server, starting it on first use. It
// skips t, saying what was not checked, when moto_server is not installed.
func Start(t testing.TB, unchecked string) *Server {
	t.Helper()
	path, err := exec.LookPath("moto_server")
	if err != nil {
		t.Skipf("moto_server is not on the PATH: %s was not checked", unchecked)
	}
	once.Do(func() { shared, failure = start(path) })
	if failure != nil {
		t.Fatalf("moto: %v", failure)
	}
	return shared
}

func start(path string) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd = exec.Command(path, "-H", "127.0.0.1", "-p", fmt.Sprint(port))
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "/moto-api/")
		if err == nil {
			resp.Body.Close()
			return &Server{URL: url}, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	cmd.Process.Kill()
	return nil, fmt.Errorf("moto_server did not answer on %s within 30s", url)
}

// Stop ends the shared server; call it from TestMain after m.Run when the
// package uses moto, so that no emulator outlives the tests.
func Stop() {
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Kill()
		cmd.Wait()
	}
}

// Main is a TestMain for packages that use moto: it runs the tests and stops
// the server afterwards.
func Main(m interface{ Run() int }) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Config is an AWS configuration whose every client talks to this server
// with dummy credentials.
func (s *Server) Config() aws.Config {
	return aws.Config{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider("testing", "testing", ""),
		BaseEndpoint: aws.String(s.URL),
	}
}

// Ping checks the server still answers.
func (s *Server) Ping(ctx context.Context) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/moto-api/", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
