package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/outboxkit/dispatcher/migrations"
	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/dbpool"
)

// migrationStatementTimeout replaces the functions' default
// statement_timeout for migrations: a migration that rewrites or indexes a
// deep outbox.pending takes longer than a claim ever should, and cut off
// half-way it would only be rolled back and tried again.
const migrationStatementTimeout = time.Hour

// openMigrator opens the migrator on the configured database, connecting
// as the functions do: --database-url or OUTBOX_DATABASE_URL, a Secrets
// Manager secret (OUTBOX_DB_SECRET_ARN) or RDS IAM authentication
// (OUTBOX_DB_IAM_AUTH with OUTBOX_DB_HOST, OUTBOX_DB_NAME, OUTBOX_DB_USER),
// with the same TLS settings. The user must own schema outbox (or be
// allowed to create it and the roles).
func (g *globalOptions) openMigrator(ctx context.Context) (*migrations.Migrator, error) {
	env := g.env()
	if !config.DatabaseConfigured(env) {
		return nil, usagef("%s", noDatabase)
	}
	// One session holds the advisory lock while another runs the
	// migrations.
	cfg, err := config.LoadDatabase(env, 2)
	if err != nil {
		return nil, usageError{err}
	}
	if err := cfg.NeedSession("the migrations (they hold a session-level advisory lock while they run)"); err != nil {
		return nil, usageError{err}
	}
	if cfg.StatementTimeout == 0 || cfg.StatementTimeout == dbpool.DefaultStatementTimeout {
		cfg.StatementTimeout = migrationStatementTimeout
	}
	deps := dbpool.Deps{ApplicationName: "outboxctl/migrate", Logger: slog.New(slog.DiscardHandler)}
	if cfg.Source != dbpool.SourceURL {
		if deps.AWS, err = awsconfig.LoadDefaultConfig(ctx); err != nil {
			return nil, fmt.Errorf("load the AWS configuration: %w", err)
		}
	}
	pool, err := dbpool.Open(ctx, cfg, deps)
	if err != nil {
		return nil, err
	}
	return migrations.OpenPool(pool.Pool)
}
