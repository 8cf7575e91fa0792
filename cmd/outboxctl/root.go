package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/ssmparam"
	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/lease"
)

// usageError is bad input on the command line: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// exitCode is main's exit status for err: 2 for usage errors, 3 for
// migrate status --check while migrations are pending, 1 for the rest.
func exitCode(err error) int {
	var (
		u usageError
		p pendingMigrationsError
	)
	switch {
	case errors.As(err, &u):
		return 2
	case errors.As(err, &p):
		return exitMigrationsPending
	}
	return 1
}

// oneLine keeps an error to the single line the operator reads.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

type globalOptions struct {
	databaseURL string
	// getenv is the process environment (os.Getenv); tests substitute
	// their own so that they can run in parallel.
	getenv func(string) string
}

// env is the environment as the commands see it: --database-url replaces
// every database source of the process's.
func (g *globalOptions) env() config.Env {
	env := config.Env{Getenv: g.getenv, ReadFile: os.ReadFile}.WithDatabaseURL(g.databaseURL)
	if g.databaseURL != "" {
		// A bad URL is the flag's, not OUTBOX_DATABASE_URL's, which may
		// not even be set.
		env.DatabaseURLSetting = "--database-url"
	}
	// OUTBOX_ROUTES_SSM_PARAMETER, for invoke dispatch and serve.
	env.ReadParameter = ssmparam.Reader(context.Background(), func(ctx context.Context) (aws.Config, error) {
		return awsconfig.LoadDefaultConfig(ctx)
	})
	return env
}

const noDatabase = "no database: set OUTBOX_DATABASE_URL or pass --database-url"

func (g *globalOptions) database() (string, error) {
	if u := config.DatabaseURL(g.env()); u != "" {
		return u, nil
	}
	return "", usagef("%s", noDatabase)
}

// connect opens a pool on the configured database — a URL, a Secrets
// Manager secret or RDS IAM authentication, as the functions do — and the
// store on it. Close the pool when done.
func (g *globalOptions) connect(ctx context.Context) (*dbpool.Pool, *lease.Store, error) {
	return g.connectWithPool(ctx, 0)
}

// connectWithPool is connect with a default pool size for commands that
// use many connections at once (OUTBOX_DB_MAX_CONNS still wins).
func (g *globalOptions) connectWithPool(ctx context.Context, poolSize int32) (*dbpool.Pool, *lease.Store, error) {
	if !config.DatabaseConfigured(g.env()) {
		return nil, nil, usagef("%s", noDatabase)
	}
	cfg, err := config.LoadDatabase(g.env(), poolSize)
	if err != nil {
		return nil, nil, usageError{err}
	}
	deps := dbpool.Deps{ApplicationName: "outboxctl", Logger: slog.New(slog.DiscardHandler)}
	if cfg.Source != dbpool.SourceURL {
		// Only a secret or an IAM token needs AWS.
		if deps.AWS, err = awsconfig.LoadDefaultConfig(ctx); err != nil {
			return nil, nil, fmt.Errorf("load the AWS configuration: %w", err)
		}
	}
	pool, err := dbpool.Open(ctx, cfg, deps)
	if err != nil {
		return nil, nil, err
	}
	return pool, lease.NewStore(pool), nil
}

func newRootCommand() *cobra.Command { return newRootCommandWithEnv(config.OS().Getenv) }

// newRootCommandWithEnv builds the command tree reading the environment
// through getenv.
func newRootCommandWithEnv(getenv func(string) string) *cobra.Command {
	g := &globalOptions{getenv: getenv}
	root := &cobra.Command{
		Use:   "outboxctl",
		Short: "Operate the transactional outbox",
		Long: `outboxctl operates the transactional outbox in PostgreSQL: see what is
queued and stuck, inspect and replay dead letters, enqueue by hand, run the
Lambda handlers locally, run a long-lived dispatcher, and receive webhook
deliveries.

New here? "outboxctl demo" (make run) shows the whole data path on this
machine in one command.

The database comes from --database-url or OUTBOX_DATABASE_URL, or, as the
functions take it, OUTBOX_DB_SECRET_ARN (a Secrets Manager secret) or RDS IAM
settings (OUTBOX_DB_IAM_AUTH=true with OUTBOX_DB_HOST, OUTBOX_DB_NAME and
OUTBOX_DB_USER) — migrate included.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       readBuildVersion().String(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.PersistentFlags().StringVar(&g.databaseURL, "database-url", "", "PostgreSQL URL (default $OUTBOX_DATABASE_URL)")
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(
		newMigrateCommand(g),
		newEnqueueCommand(g),
		newStatusCommand(g),
		newPendingCommand(g),
		newDeadCommand(g),
		newReplayCommand(g),
		newRetryCommand(g),
		newBlockedCommand(g),
		newDiscardCommand(g),
		newPauseCommand(g),
		newResumeCommand(g),
		newInvokeCommand(g),
		newServeCommand(g),
		newSinkCommand(g),
		newDemoCommand(g),
		newVersionCommand(),
		newRoutesCommand(g),
	)
	finishCommandTree(root)
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

// noArgs refuses positional arguments as a usage error (cobra.NoArgs's
// error would exit 1).
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}

// exactArgs wants n positional arguments, named in the message.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s needs %s", cmd.CommandPath(), what)
		}
		return nil
	}
}

// flagError is every command's answer to a flag it cannot parse: a usage
// error, and for an unknown flag the nearest of the command's own and
// inherited flags ("unknown flag: --jsn: did you mean --json?"), which
// cobra suggests for commands only.
func flagError(cmd *cobra.Command, err error) error {
	var unknown *pflag.NotExistError
	if !errors.As(err, &unknown) || unknown.GetSpecifiedName() == "" {
		return usageError{err}
	}
	var names []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			names = append(names, f.Name)
		}
	})
	cmd.InheritedFlags().VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && !slices.Contains(names, f.Name) {
			names = append(names, f.Name)
		}
	})
	near := suggest(unknown.GetSpecifiedName(), names)
	if len(near) == 0 {
		return usagef("%v (see %s --help)", err, cmd.CommandPath())
	}
	for i := range near {
		near[i] = "--" + near[i]
	}
	return usagef("%v: did you mean %s?", err, orList(near))
}

// withStore is the flow every database command shares: connect, run fn
// with the store (and the pool, for what the store does not cover), close.
func (g *globalOptions) withStore(ctx context.Context, fn func(*dbpool.Pool, *lease.Store) error) error {
	pool, store, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	return fn(pool, store)
}

// list is the flow of the read-only listing commands: read with the store,
// then print as JSON with --json, else as print renders it for a reader.
func list[T any](cmd *cobra.Command, g *globalOptions, asJSON bool, read func(*lease.Store) (T, error), print func(io.Writer, T, time.Time)) error {
	return g.withStore(cmd.Context(), func(_ *dbpool.Pool, store *lease.Store) error {
		v, err := read(store)
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSON(cmd.OutOrStdout(), v)
		}
		print(cmd.OutOrStdout(), v, time.Now())
		return nil
	})
}
