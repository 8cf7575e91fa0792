package statemachine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/migrations"
	"github.com/outboxkit/dispatcher/shared/localpg"
)

// Server hands out fresh migrated databases on one PostgreSQL server,
// each a copy of a template migrated once, for runs of many seeds.
type Server struct {
	url      string // the administrative connection string
	template string
}

// OpenServer migrates a template database on the server serverURL names
// (its user must be able to create databases and roles). Close drops it.
func OpenServer(ctx context.Context, serverURL string) (*Server, error) {
	s := &Server{url: serverURL, template: "statemachine_tmpl_" + randomHex(6)}
	admin, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, fmt.Errorf("statemachine: %w", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{s.template}.Sanitize()); err != nil {
		return nil, fmt.Errorf("statemachine: create template: %w", err)
	}
	m, err := migrations.Open(withDatabase(serverURL, s.template))
	if err == nil {
		_, err = m.Up(ctx)
		m.Close()
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("statemachine: migrate the template: %w", err)
	}
	return s, nil
}

// NewDatabase copies the template into a new database and returns its
// URL (as the server's user) and a function that drops it.
func (s *Server) NewDatabase(ctx context.Context) (string, func(), error) {
	name := "statemachine_" + randomHex(6)
	admin, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return "", nil, fmt.Errorf("statemachine: %w", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{s.template}.Sanitize())); err != nil {
		return "", nil, fmt.Errorf("statemachine: create a database: %w", err)
	}
	drop := func() { s.drop(name) }
	return withDatabase(s.url, name), drop, nil
}

// Close drops the template.
func (s *Server) Close() { s.drop(s.template) }

func (s *Server) drop(name string) {
	if os.Getenv("STATEMACHINE_KEEP_DATABASES") != "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return
	}
	defer admin.Close(context.Background())
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// Cluster is a throwaway PostgreSQL cluster started by shared/localpg with
// autovacuum on (the host's server may run without it, which keeps dead
// rows and index entries a run leaves behind in the way of the next
// statements; a deployment runs with it).
type Cluster struct {
	*localpg.Cluster
	dir string
}

// StartCluster initialises and starts a cluster in a new temporary
// directory. Stop removes it.
func StartCluster(ctx context.Context) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "outbox-statemachine-pg-")
	if err != nil {
		return nil, fmt.Errorf("statemachine: %w", err)
	}
	c, err := localpg.Start(ctx, localpg.Options{
		Dir:            dir,
		StartTimeout:   2 * time.Minute,
		MaxConnections: 100,
		Settings: []string{
			"autovacuum=on",
			// The launcher visits each database once per naptime: at the
			// default minute, a run of seconds would never see it.
			"autovacuum_naptime=1s",
			"log_min_messages=warning",
		},
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("statemachine: %w", err)
	}
	return &Cluster{Cluster: c, dir: dir}, nil
}

// Stop stops the server at once and removes its files.
func (c *Cluster) Stop() {
	_ = c.StopImmediate(context.Background())
	os.RemoveAll(c.dir)
}

// PrepareSQL is a Config.Prepare that runs sql (one or more statements)
// as the superuser: to swap a function for a deliberately broken one.
func PrepareSQL(sql string) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, admin *pgx.Conn) error {
		_, err := admin.Exec(ctx, sql)
		return err
	}
}

func withDatabase(serverURL, name string) string {
	u, err := url.Parse(serverURL)
	if err != nil {
		return serverURL
	}
	u.Path = "/" + name
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
