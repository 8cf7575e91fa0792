package workload

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/migrations"
)

// Database is a scratch database with the outbox migrations applied, for
// programs that are not tests (tests use shared/testkit/pgtest).
type Database struct {
	Name string
	// URL connects to it as the server URL's (super)user.
	URL string
	// Pool is a pool on URL.
	Pool     *pgxpool.Pool
	adminURL string
}

// CreateDatabase creates <prefix>_<random> on the server serverURL names
// (its user must be able to create databases and roles) and migrates it.
func CreateDatabase(ctx context.Context, serverURL, prefix string) (*Database, error) {
	suffix := make([]byte, 4)
	rand.Read(suffix)
	name := prefix + "_" + hex.EncodeToString(suffix)
	admin, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, fmt.Errorf("workload: connect to %s: %w", redact(serverURL), err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("workload: create database %s: %w", name, err)
	}
	db := &Database{Name: name, URL: withDatabase(serverURL, name), adminURL: serverURL}
	m, err := migrations.Open(db.URL)
	if err == nil {
		_, err = m.Up(ctx)
		m.Close()
	}
	if err == nil {
		db.Pool, err = pgxpool.New(ctx, db.URL)
	}
	if err != nil {
		db.Drop()
		return nil, fmt.Errorf("workload: prepare database %s: %w", name, err)
	}
	return db, nil
}

// Drop closes the pool and drops the database, ending its sessions.
func (db *Database) Drop() error {
	if db.Pool != nil {
		db.Pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, db.adminURL)
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db.Name}.Sanitize()+" WITH (FORCE)")
	return err
}

func withDatabase(serverURL, name string) string {
	u, err := url.Parse(serverURL)
	if err != nil {
		return serverURL
	}
	u.Path = "/" + name
	return u.String()
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "the database URL"
	}
	return u.Redacted()
}
