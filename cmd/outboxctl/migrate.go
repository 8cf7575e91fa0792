package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/migrations"
)

func newMigrateCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate up|down|status",
		Short: "Apply, roll back or list the outbox schema migrations",
		Long: `Apply, roll back or list the outbox schema migrations embedded in this binary.

The database is the one every command takes: --database-url or
OUTBOX_DATABASE_URL, or the functions' own settings, a Secrets Manager secret
(OUTBOX_DB_SECRET_ARN) or RDS IAM authentication (OUTBOX_DB_IAM_AUTH=true,
OUTBOX_DB_HOST, OUTBOX_DB_NAME, OUTBOX_DB_USER), over TLS as the functions
connect; statements may run for up to an hour unless
OUTBOX_DB_STATEMENT_TIMEOUT says otherwise. The user must own schema outbox
(the first migration creates it, and the roles). Inside a VPC with no
laptop on the database network, the stack's migrate function runs the same
migrations on deploy (see docs/DEPLOYING.md).

Migrations create schema outbox, its functions and the NOLOGIN roles
outbox_producer, outbox_dispatcher, outbox_operator and outbox_reader. Applied
versions are recorded in public.outbox_schema_migrations; an advisory lock
serialises concurrent migrators. Applying twice is a no-op.

Rolling back migration 1 drops schema outbox with every pending message,
dead letter and archived attempt in it, and the pauses in force and the
producers' namespace confinements with them. So while the outbox holds any
of those, migrate down lists what it would roll back and what would be lost,
and refuses (exit 2) unless --yes is given. An empty outbox is rolled back
without asking.`,
		Example: `  outboxctl migrate up
  outboxctl migrate status --database-url postgres://admin@db:5432/app
  outboxctl migrate down                # roll back the latest migration
  outboxctl migrate down --to 0         # remove the outbox entirely, if it holds no messages
  outboxctl migrate down --to 0 --yes   # remove it with the messages still in it`,
	}
	open := func(ctx context.Context) (*migrations.Migrator, error) { return g.openMigrator(ctx) }

	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every migration not yet applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := open(cmd.Context())
			if err != nil {
				return err
			}
			defer m.Close()
			applied, err := m.Up(cmd.Context())
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "outbox schema is up to date (version %d)\n", m.Latest())
			}
			printApplied(cmd.OutOrStdout(), applied)
			return nil
		},
	}

	var (
		to  string
		yes bool
	)
	down := &cobra.Command{
		Use:   "down",
		Short: "Roll back the latest migration, or every one above --to (--yes if messages wait)",
		Long: `Roll back the latest applied migration, or with --to every applied one above
that version (--to 0 removes the outbox: schema outbox and its data).

While the outbox holds messages (rows in outbox.pending or outbox.dead),
pauses in force or confined producers, it prints them (with the archived
attempts) and the migrations it would roll back, and refuses with exit
status 2 unless --yes is given. An empty outbox is rolled back without
asking.`,
		Example: `  outboxctl migrate down                # the latest migration
  outboxctl migrate down --to 0         # remove the outbox, if it holds no messages
  outboxctl migrate down --to 0 --yes   # remove it with its messages`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			target := int64(-1) // one step
			if to != "" {
				version, perr := strconv.ParseInt(to, 10, 64)
				if perr != nil || version < 0 {
					return usagef("--to must be a migration version (0 or more), got %q", to)
				}
				target = version
			}
			m, err := open(cmd.Context())
			if err != nil {
				return err
			}
			defer m.Close()
			if !yes {
				if err := refuseWhileMessagesWait(cmd.Context(), cmd.OutOrStdout(), m, target); err != nil {
					return err
				}
			}
			var rolledBack []migrations.Result
			if target >= 0 {
				rolledBack, err = m.DownTo(cmd.Context(), target)
			} else {
				rolledBack, err = m.Down(cmd.Context())
			}
			if err != nil {
				return err
			}
			if len(rolledBack) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "nothing to roll back")
			}
			for _, r := range rolledBack {
				fmt.Fprintf(cmd.OutOrStdout(), "rolled back %s (%s)\n", r.Source, r.Duration)
			}
			return nil
		},
	}
	down.Flags().StringVar(&to, "to", "", "roll back every migration above this version (0: all)")
	down.Flags().BoolVar(&yes, "yes", false, "roll back even while the outbox holds pending messages or dead letters")

	var (
		statusJSON bool
		check      bool
	)
	status := &cobra.Command{
		Use:   "status [--json] [--check]",
		Short: "List the migrations and whether each is applied (--check: exit 3 while any is pending)",
		Long: `List the migrations embedded in this binary and whether each is applied.

--json prints them as one JSON document: the latest version this binary
knows, the version applied, and each migration with its state.

--check is for deploy pipelines: it exits 3 while any migration is pending
(a newer outboxctl than the database's schema), 0 when the schema is up to
date. Exit codes: 0 up to date (or, without --check, listed), 1 the
database could not be read, 2 a usage error, 3 migrations pending (--check).`,
		Example: `  outboxctl migrate status
  outboxctl migrate status --json | jq '.pending'
  outboxctl migrate status --check || outboxctl migrate up   # in a deploy step`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := open(cmd.Context())
			if err != nil {
				return err
			}
			defer m.Close()
			states, err := m.Status(cmd.Context())
			if err != nil {
				return err
			}
			doc := migrationStatusOf(states, m.Latest())
			if statusJSON {
				if err := writeJSON(cmd.OutOrStdout(), doc); err != nil {
					return err
				}
			} else {
				for _, s := range doc.Migrations {
					state := "pending"
					if s.Applied {
						state = "applied"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%-8s %05d  %s\n", state, s.Version, s.Source)
				}
				// Function files: each one pending, unless every one is (a
				// schema not yet created).
				if pending := doc.pendingFunctions(); pending < len(doc.Functions) {
					for _, f := range doc.Functions {
						if !f.Applied {
							fmt.Fprintf(cmd.OutOrStdout(), "pending         %s\n", f.Source)
						}
					}
					fmt.Fprintf(cmd.OutOrStdout(), "applied         %d of %d SQL function files (migrations/functions)\n",
						len(doc.Functions)-pending, len(doc.Functions))
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "pending         %d SQL function files (migrations/functions)\n", pending)
				}
			}
			if check && doc.Pending > 0 {
				functions := doc.pendingFunctions()
				return pendingMigrationsError{pending: doc.Pending - functions, functions: functions,
					applied: doc.AppliedVersion, latest: doc.LatestVersion}
			}
			return nil
		},
	}
	status.Flags().BoolVar(&statusJSON, "json", false, "print the migrations as JSON")
	status.Flags().BoolVar(&check, "check", false, "exit 3 while any migration is pending")
	cmd.AddCommand(up, down, status)
	return cmd
}

// migrationStatus is migrate status --json's document.
type migrationStatus struct {
	// LatestVersion is the newest migration this binary holds.
	LatestVersion int64 `json:"latest_version"`
	// AppliedVersion is the newest applied one (0: none).
	AppliedVersion int64 `json:"applied_version"`
	// Pending counts the versioned migrations and the function files not
	// applied.
	Pending    int                   `json:"pending"`
	UpToDate   bool                  `json:"up_to_date"`
	Migrations []migrationStatusItem `json:"migrations"`
	// Functions are the SQL function files (migrations/functions): applied
	// when the database holds the file's checksum.
	Functions []migrationStatusItem `json:"functions"`
}

func (doc migrationStatus) pendingFunctions() int {
	n := 0
	for _, f := range doc.Functions {
		if !f.Applied {
			n++
		}
	}
	return n
}

type migrationStatusItem struct {
	Version int64  `json:"version"`
	Source  string `json:"source"`
	Applied bool   `json:"applied"`
}

func migrationStatusOf(states []migrations.Status, latest int64) migrationStatus {
	doc := migrationStatus{LatestVersion: latest, Migrations: []migrationStatusItem{}, Functions: []migrationStatusItem{}}
	for _, s := range states {
		item := migrationStatusItem{Version: s.Version, Source: s.Source, Applied: s.Applied}
		if s.Version == 0 {
			doc.Functions = append(doc.Functions, item)
		} else {
			doc.Migrations = append(doc.Migrations, item)
		}
		if s.Applied {
			doc.AppliedVersion = max(doc.AppliedVersion, s.Version)
		} else {
			doc.Pending++
		}
	}
	doc.UpToDate = doc.Pending == 0
	return doc
}

// exitMigrationsPending is migrate status --check's exit status while
// migrations are pending: apart from 1 (the database could not be read)
// and 2 (usage), so that a pipeline can tell "migrate first" from "broken".
const exitMigrationsPending = 3

// pendingMigrationsError is migrate status --check's answer while
// migrations wait to be applied.
type pendingMigrationsError struct {
	pending, functions int
	applied, latest    int64
}

func (e pendingMigrationsError) Error() string {
	what := fmt.Sprintf("%d migration%s", e.pending, plural(e.pending))
	if e.functions > 0 {
		what += fmt.Sprintf(" and %d SQL function file%s", e.functions, plural(e.functions))
	}
	return fmt.Sprintf("%s pending (database at version %d, this outboxctl at %d): run `outboxctl migrate up`",
		what, e.applied, e.latest)
}

// printApplied lists what migrate up applied: each versioned migration, and
// the function files in one line (a new schema applies every one of them).
func printApplied(w io.Writer, applied []migrations.Result) {
	var functions []string
	for _, r := range applied {
		if r.Version > 0 {
			fmt.Fprintf(w, "applied %s (%s)\n", r.Source, r.Duration)
			continue
		}
		functions = append(functions, strings.TrimSuffix(strings.TrimPrefix(r.Source, migrations.FunctionsDir+"/"), ".sql"))
	}
	switch {
	case len(functions) == 0:
	case len(functions) <= 5:
		fmt.Fprintf(w, "applied SQL function%s %s (migrations/functions)\n", plural(len(functions)), strings.Join(functions, ", "))
	default:
		fmt.Fprintf(w, "applied %d SQL function files (migrations/functions)\n", len(functions))
	}
}

// countTimeout bounds counting the outbox before a rollback: count(*) reads
// the whole of a deep backlog.
const countTimeout = time.Minute

// outboxCounts is what a rollback of schema outbox would drop: messages,
// the archive, and the operators' state that holds messages back or
// confines producers (pauses in force, confined producer roles).
type outboxCounts struct {
	pending, dead, attempts, confined int64
	pauses                            []string
}

// held says what a rollback would lose that someone relies on, or "".
func (n outboxCounts) held() string {
	var parts []string
	if n.pending > 0 || n.dead > 0 {
		parts = append(parts, fmt.Sprintf("%s pending message%s, %s dead letter%s and %s archived attempt%s",
			count(n.pending), plural(int(n.pending)), count(n.dead), plural(int(n.dead)), count(n.attempts), plural(int(n.attempts))))
	}
	if len(n.pauses) > 0 {
		parts = append(parts, fmt.Sprintf("%d pause%s in force (%s): their messages would be claimed once the schema is back",
			len(n.pauses), plural(len(n.pauses)), strings.Join(n.pauses, ", ")))
	}
	if n.confined > 0 {
		parts = append(parts, fmt.Sprintf("%d confined producer role%s: they could enqueue into any namespace once the schema is back",
			n.confined, plural(int(n.confined))))
	}
	return strings.Join(parts, "; ")
}

// refuseWhileMessagesWait is migrate down's confirmation: when the
// rollback would touch an outbox that holds pending messages or dead
// letters, it prints the counts and the migrations it would roll back, and
// refuses as a usage error. target is --to, or -1 for one step.
func refuseWhileMessagesWait(ctx context.Context, w io.Writer, m *migrations.Migrator, target int64) error {
	plan, err := rollbackPlan(ctx, m, target)
	if err != nil || len(plan) == 0 {
		return err // with nothing to roll back, the migrator says so
	}
	n, err := countOutbox(ctx, m.DB())
	if err != nil {
		return err
	}
	held := n.held()
	if held == "" {
		return nil
	}
	fmt.Fprintf(w, "the outbox holds %s\n", held)
	fmt.Fprintln(w, "migrate down would roll back:")
	for _, s := range plan {
		note := ""
		if s.Version == 1 {
			note = "  (drops schema outbox, with its messages, pauses and namespace grants)"
		}
		fmt.Fprintf(w, "  %s%s\n", s.Source, note)
	}
	return usagef("refusing to roll back while the outbox holds %s: pass --yes to roll back anyway", held)
}

// rollbackPlan is what migrate down would roll back, newest first: the
// latest applied migration for one step (target -1), else every applied
// one above target.
func rollbackPlan(ctx context.Context, m *migrations.Migrator, target int64) ([]migrations.Status, error) {
	states, err := m.Status(ctx)
	if err != nil {
		return nil, err
	}
	var plan []migrations.Status
	for i := len(states) - 1; i >= 0; i-- {
		s := states[i]
		if !s.Applied || (target >= 0 && s.Version <= target) {
			continue
		}
		plan = append(plan, s)
		if target < 0 {
			break
		}
	}
	return plan, nil
}

// countOutbox counts the messages, archived attempts, pauses in force and
// confined producer roles in schema outbox (none if there is no such
// schema), on the migrator's database.
func countOutbox(ctx context.Context, db *sql.DB) (outboxCounts, error) {
	ctx, cancel := context.WithTimeout(ctx, countTimeout)
	defer cancel()
	var n outboxCounts
	exists := func(table string) (bool, error) {
		var ok bool
		err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok)
		return ok, err
	}
	for _, c := range []struct {
		table string
		into  *int64
	}{{"outbox.pending", &n.pending}, {"outbox.dead", &n.dead}, {"outbox.attempts", &n.attempts}, {"outbox.confined_producers", &n.confined}} {
		ok, err := exists(c.table)
		if err != nil {
			return outboxCounts{}, fmt.Errorf("count the outbox's messages: %w", err)
		}
		if !ok {
			continue
		}
		// c.table is one of the constants above, never input.
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+c.table).Scan(c.into); err != nil {
			return outboxCounts{}, fmt.Errorf("count %s: %w", c.table, err)
		}
	}
	if ok, err := exists("outbox.paused"); err != nil {
		return outboxCounts{}, fmt.Errorf("list the pauses: %w", err)
	} else if ok {
		rows, err := db.QueryContext(ctx, `SELECT namespace || '/' || topic FROM outbox.paused ORDER BY 1`)
		if err != nil {
			return outboxCounts{}, fmt.Errorf("list the pauses: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var p string
			if err := rows.Scan(&p); err != nil {
				return outboxCounts{}, fmt.Errorf("list the pauses: %w", err)
			}
			n.pauses = append(n.pauses, p)
		}
		if err := rows.Err(); err != nil {
			return outboxCounts{}, fmt.Errorf("list the pauses: %w", err)
		}
	}
	return n, nil
}
