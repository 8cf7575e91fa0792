package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// usageError is bad input on the command line: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

// oneLine keeps an error to the single line the operator reads.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

type globalOptions struct {
	databaseURL string
}

func (g *globalOptions) database() (string, error) {
	if g.databaseURL != "" {
		return g.databaseURL, nil
	}
	if u := os.Getenv("OUTBOX_DATABASE_URL"); u != "" {
		return u, nil
	}
	return "", usagef("no database: set OUTBOX_DATABASE_URL or pass --database-url")
}

func newRootCommand() *cobra.Command {
	g := &globalOptions{}
	root := &cobra.Command{
		Use:   "outboxctl",
		Short: "Operate the transactional outbox",
		Long: `outboxctl operates the transactional outbox in PostgreSQL.

The database comes from --database-url or OUTBOX_DATABASE_URL.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.databaseURL, "database-url", "", "PostgreSQL URL (default $OUTBOX_DATABASE_URL)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newMigrateCommand(g))
	return root
}

// redact hides the password of a connection URL in messages.
func redact(connString string) string {
	u, err := url.Parse(connString)
	if err != nil || u.Scheme == "" {
		return "(database URL)"
	}
	return u.Redacted()
}
