package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/migrations"
)

func newMigrateCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate up|down|status",
		Short: "Apply, roll back or list the outbox schema migrations",
		Long: `Apply, roll back or list the outbox schema migrations embedded in this binary.

Migrations create schema outbox, its functions and the NOLOGIN roles
outbox_producer, outbox_dispatcher, outbox_operator and outbox_reader. Applied
versions are recorded in public.outbox_schema_migrations; an advisory lock
serialises concurrent migrators. Applying twice is a no-op.`,
		Example: `  outboxctl migrate up
  outboxctl migrate status --database-url postgres://admin@db:5432/app
  outboxctl migrate down            # roll back the latest migration
  outboxctl migrate down --to 0     # remove the outbox entirely`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown migrate subcommand %q: use up, down or status", args[0])
			}
			return usagef("migrate needs a subcommand: up, down or status")
		},
	}
	open := func() (*migrations.Migrator, error) {
		dbURL, err := g.database()
		if err != nil {
			return nil, err
		}
		return migrations.Open(dbURL)
	}

	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every migration not yet applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := open()
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
			for _, r := range applied {
				fmt.Fprintf(cmd.OutOrStdout(), "applied %s (%s)\n", r.Source, r.Duration)
			}
			return nil
		},
	}

	var to string
	down := &cobra.Command{
		Use:   "down",
		Short: "Roll back the latest migration, or every one above --to",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := open()
			if err != nil {
				return err
			}
			defer m.Close()
			var rolledBack []migrations.Result
			if to != "" {
				version, perr := strconv.ParseInt(to, 10, 64)
				if perr != nil || version < 0 {
					return usagef("--to must be a migration version (0 or more), got %q", to)
				}
				rolledBack, err = m.DownTo(cmd.Context(), version)
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

	status := &cobra.Command{
		Use:   "status",
		Short: "List the migrations and whether each is applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := open()
			if err != nil {
				return err
			}
			defer m.Close()
			states, err := m.Status(cmd.Context())
			if err != nil {
				return err
			}
			for _, s := range states {
				state := "pending"
				if s.Applied {
					state = "applied"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%-8s %05d  %s\n", state, s.Version, s.Source)
			}
			return nil
		},
	}
	cmd.AddCommand(up, down, status)
	return cmd
}
