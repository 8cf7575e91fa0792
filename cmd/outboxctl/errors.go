package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/dispatcher/shared/lease"
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
// the outbox schema, and an action the database refused, in its words
// under the command's name. Other errors pass through unchanged.
func explain(command string, err error) error {
	if err == nil {
		return nil
	}
	if r := refusal(command, err); r != nil {
		return r
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

// refusedError is an operator action the outbox's functions refused for
// the state of what it names (lease.ErrRefused, SQLSTATE P7005) or for an
// argument (lease.ErrInvalidArgument, 22023): the function's own message
// and hint, without the layers' prefixes ("lease: operator action
// refused (retry now): ERROR: outbox.retry_now: … (SQLSTATE P7005)")
// that mean nothing to an operator. The SQLSTATE is kept for --json.
type refusedError struct {
	// command is what the operator ran: retry, dead purge.
	command  string
	message  string
	hint     string
	sqlstate string
	// dryRun: the refusal of a call made to see what --yes would do.
	dryRun bool
	err    error
}

func (e refusedError) Error() string {
	verb := e.command + " refused"
	if e.dryRun {
		verb = e.command + " would be refused, nothing would change"
	}
	s := verb + ": " + e.message
	if e.hint != "" {
		s += " (" + strings.TrimSuffix(e.hint, ".") + ")"
	}
	return s
}
func (e refusedError) Unwrap() error { return e.err }

// refusedJSON is a refusal as --json prints it on stdout.
type refusedJSON struct {
	Error    string `json:"error"`
	Refused  bool   `json:"refused"`
	DryRun   bool   `json:"dry_run,omitempty"`
	SQLState string `json:"sqlstate"`
}

func (e refusedError) json() refusedJSON {
	return refusedJSON{Error: e.Error(), Refused: true, DryRun: e.dryRun, SQLState: e.sqlstate}
}

// functionPrefix is how the outbox's functions begin their messages.
var functionPrefix = regexp.MustCompile(`^outbox\.[a-z_]+: `)

// refusal is err as a refusedError when the database refused an action;
// nil otherwise.
func refusal(command string, err error) error {
	var (
		already refusedError
		pgErr   *pgconn.PgError
	)
	if errors.As(err, &already) {
		return already
	}
	if !errors.Is(err, lease.ErrRefused) && !errors.Is(err, lease.ErrInvalidArgument) || !errors.As(err, &pgErr) {
		return nil
	}
	return refusedError{command: command, message: functionPrefix.ReplaceAllString(pgErr.Message, ""),
		hint: pgErr.Hint, sqlstate: pgErr.Code, err: err}
}

// commandName is what the operator typed to run cmd: "retry", "dead purge".
func commandName(cmd interface{ CommandPath() string }) string {
	_, name, _ := strings.Cut(cmd.CommandPath(), " ")
	return name
}
