package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/localpg"
)

// demoServer is the PostgreSQL server the demo runs on.
type demoServer struct {
	// adminURL connects to a database of the server as a user who may
	// create databases.
	adminURL string
	// describe says which server it is, for the operator.
	describe string
	// persistent is false for a throwaway cluster, stopped at the end.
	persistent bool
	stop       func(context.Context) error
}

// localServerUsers are tried, in order, on the server at 127.0.0.1:5432:
// Debian's and the Docker image's superuser, then Homebrew's (the OS user).
func localServerUsers(pgUser string) []string {
	users := []string{}
	if u := pgUser; u != "" {
		users = append(users, u)
	}
	users = append(users, "postgres")
	if u, err := user.Current(); err == nil && u.Username != "postgres" {
		users = append(users, u.Username)
	}
	return users
}

// findServer picks the demo's server: OUTBOX_DATABASE_URL's, else the
// local one at 127.0.0.1:5432, else a throwaway cluster started from the
// PostgreSQL binaries on the machine, else none, with a message that says
// how to install PostgreSQL.
func findServer(ctx context.Context, g *globalOptions, mode, localDir string) (*demoServer, error) {
	if u := config.DatabaseURL(g.env()); u != "" {
		return &demoServer{adminURL: u, describe: "the server of OUTBOX_DATABASE_URL (" + hostOf(u) + ")", persistent: true}, nil
	}
	var tried []string
	if mode == "auto" {
		for _, name := range localServerUsers(config.LoadDemo(g.env()).PGUser) {
			candidate := fmt.Sprintf("postgres://%s@127.0.0.1:5432/postgres?sslmode=disable", url.PathEscape(name))
			pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
			conn, err := pgx.Connect(pingCtx, candidate)
			cancel()
			if err == nil {
				conn.Close(ctx)
				return &demoServer{adminURL: candidate, describe: "the local server at 127.0.0.1:5432 (user " + name + ")", persistent: true}, nil
			}
			tried = append(tried, fmt.Sprintf("127.0.0.1:5432 as %s: %s", name, firstLine(err)))
			if isConnectionRefused(err) {
				break // no server: other users will not help
			}
		}
	}
	c, err := localpg.Start(ctx, localpg.Options{Dir: filepath.Join(localDir, "pg")})
	if errors.Is(err, localpg.ErrNotInstalled) {
		return nil, fmt.Errorf("no PostgreSQL: no server answers at 127.0.0.1:5432 and there are no PostgreSQL binaries to start one; %s", localpg.InstallHint)
	}
	if err != nil {
		if len(tried) > 0 {
			return nil, fmt.Errorf("no PostgreSQL: %s; and a throwaway cluster did not start: %w", strings.Join(tried, "; "), err)
		}
		return nil, err
	}
	how := "reused"
	if c.Initialized {
		how = "created"
	}
	return &demoServer{
		adminURL:   c.URL,
		describe:   fmt.Sprintf("a throwaway PostgreSQL %s cluster on 127.0.0.1:%d (%s in %s, stopped at the end)", c.Version, c.Port, how, filepath.Dir(c.DataDir)),
		persistent: false,
		stop:       c.Stop,
	}, nil
}

var databaseNamePattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// freshDatabase drops and creates the demo's database on the server and
// returns its URL. It refuses to drop the database OUTBOX_DATABASE_URL
// names: that one may hold someone's data.
func freshDatabase(ctx context.Context, adminURL, name string) (string, error) {
	if !databaseNamePattern.MatchString(name) {
		return "", usagef("--demo-database must be a plain lower-case database name, got %q", name)
	}
	target, err := withDatabase(adminURL, name)
	if err != nil {
		return "", err
	}
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return "", usagef("the database URL is not valid: %v", err)
	}
	if cfg.Database == name {
		return "", usagef("refusing to drop database %q, which OUTBOX_DATABASE_URL names: pick another --demo-database", name)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", redact(adminURL), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("drop the previous run's database %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", fmt.Errorf("create database %s (the user needs CREATEDB): %w", name, err)
	}
	return target, nil
}

// withDatabase points a connection string at another database.
func withDatabase(connString, name string) (string, error) {
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String(), nil
	}
	if _, err := pgx.ParseConfig(connString); err != nil {
		return "", usagef("the database URL is not valid: %v", err)
	}
	// key=value form: a later dbname wins.
	return connString + " dbname=" + name, nil
}

func hostOf(connString string) string {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return "unparsable URL"
	}
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
}

func isConnectionRefused(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection refused")
}

func firstLine(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

// demoLog is where the demo's handlers write their JSON logs and metrics:
// a file to read afterwards, rather than thousands of lines on the screen.
func demoLog(localDir string) (*os.File, error) {
	if err := os.MkdirAll(localDir, 0o755); err != nil {
		return nil, err
	}
	return os.Create(filepath.Join(localDir, "demo.log"))
}
