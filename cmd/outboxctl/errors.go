package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// printError writes err as main reports it: the first line after
// "outboxctl: ", and each further problem of a multi-problem error (a
// configuration's errors.Join) on a line of its own, indented, so that
// none of four problems hides behind the others on one long line.
func printError(w io.Writer, err error) {
	for i, line := range problemLines(err) {
		if i == 0 {
			fmt.Fprintf(w, "outboxctl: %s\n", line)
		} else {
			fmt.Fprintf(w, "  %s\n", line)
		}
	}
}

// problemLines splits err's message into its lines, spacing normalised.
// The lines after a heading that ends in a colon (a routes file's "(2
// problems):") are indented under it, as the problems it counts.
func problemLines(err error) []string {
	var (
		lines  []string
		nested bool
	)
	for _, line := range strings.Split(err.Error(), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		text := strings.Join(fields, " ")
		if nested {
			text = "  " + text
		}
		lines = append(lines, text)
		nested = nested || (len(lines) > 0 && strings.HasSuffix(text, ":"))
	}
	if len(lines) == 0 {
		return []string{"failed"}
	}
	return lines
}

// explain rewrites the errors an operator meets first into what to do
// about them: a database that does not answer, does not exist, or lacks
// the outbox schema. Other errors pass through unchanged.
func explain(err error) error {
	if err == nil {
		return nil
	}
	if d := dialFailure(err); d != nil {
		return d
	}
	if m := missingDatabase(err); m != nil {
		return m
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "3F000", "42P01", "42883": // invalid_schema_name, undefined_table, undefined_function
			return unmigratedError{err}
		}
	}
	return err
}

// unmigratedError is a database without the outbox schema, or with an
// older one than this outboxctl expects.
type unmigratedError struct{ err error }

func (e unmigratedError) Error() string {
	return e.err.Error() + ": the database lacks the outbox schema or part of it; run `outboxctl migrate up` (with the same database settings)"
}
func (e unmigratedError) Unwrap() error { return e.err }

// dialError is a database that could not be reached at all. pgx reports
// every address it tried (and for sslmode=prefer each address twice, with
// and without TLS), so one refused connection reads as two errors; this is
// one line naming the server, with the password never shown.
type dialError struct {
	// server is user@host:port/database, without a password.
	server string
	cause  string
	err    error
}

func (e dialError) Error() string {
	return fmt.Sprintf("cannot reach PostgreSQL at %s (%s): is the server running, and are the host and port right?", e.server, e.cause)
}
func (e dialError) Unwrap() error { return e.err }

// dialFailure is err as a dialError when err is a connection attempt
// that failed before PostgreSQL answered (refused, unreachable, no such
// host, timed out); nil otherwise, e.g. for a wrong password, which the
// server itself reported.
func dialFailure(err error) error {
	var connectErr *pgconn.ConnectError
	if !errors.As(err, &connectErr) || connectErr.Config == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return nil // the server answered
	}
	var (
		opErr   *net.OpError
		dnsErr  *net.DNSError
		timeout interface{ Timeout() bool }
		cause   string
	)
	switch {
	case errors.As(err, &dnsErr):
		cause = "no such host"
		if !dnsErr.IsNotFound {
			cause = "host name lookup failed"
		}
	case errors.As(err, &opErr) && opErr.Op == "dial":
		cause = opErr.Err.Error()
		var sysErr interface{ Unwrap() error }
		if errors.As(opErr.Err, &sysErr) && sysErr.Unwrap() != nil {
			cause = sysErr.Unwrap().Error() // "connection refused", not "connect: connection refused"
		}
	case errors.As(err, &timeout) && timeout.Timeout(), errors.Is(err, context.DeadlineExceeded):
		cause = "timed out"
	default:
		return nil
	}
	cfg := connectErr.Config
	server := serverAddress(cfg)
	if cfg.User != "" {
		server = cfg.User + "@" + server
	}
	if cfg.Database != "" {
		server += "/" + cfg.Database
	}
	return dialError{server: server, cause: cause, err: err}
}

// missingDatabaseError is a server that answered that the database named
// does not exist (SQLSTATE 3D000): one line naming it and the server,
// instead of pgx's chain of the connection attempt.
type missingDatabaseError struct {
	database, server string
	err              error
}

func (e missingDatabaseError) Error() string {
	return fmt.Sprintf("database %q does not exist on %s: create it, or correct the database's name in the connection settings", e.database, e.server)
}
func (e missingDatabaseError) Unwrap() error { return e.err }

// missingDatabase is err as a missingDatabaseError when the server refused
// the connection for want of the database; nil otherwise.
func missingDatabase(err error) error {
	var (
		connectErr *pgconn.ConnectError
		pgErr      *pgconn.PgError
	)
	if !errors.As(err, &connectErr) || connectErr.Config == nil || !errors.As(err, &pgErr) || pgErr.Code != "3D000" {
		return nil
	}
	return missingDatabaseError{database: connectErr.Config.Database, server: serverAddress(connectErr.Config), err: err}
}

// serverAddress is host:port, or a Unix socket's directory.
func serverAddress(cfg *pgconn.Config) string {
	if strings.HasPrefix(cfg.Host, "/") {
		return cfg.Host
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}
