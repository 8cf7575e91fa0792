package infra_test

import (
	"strings"
	"testing"
)

// Migrations run from inside the VPC on deploy: the custom resource calls
// the migrate function and changes — so CloudFormation sends an Update,
// and the function applies what is new — whenever the function's code,
// which embeds the migrations, does.
func TestDeployRunsTheMigrationsFromInsideTheVPC(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	schema := tpl.get("Resources", "OutboxSchema")
	if schema.get("Type").str() != "Custom::OutboxSchema" || schema.get("Condition").str() != "MigrateOnDeploy" {
		t.Fatalf("OutboxSchema: a Custom::OutboxSchema under condition MigrateOnDeploy, got %q under %q", schema.get("Type").str(), schema.get("Condition").str())
	}
	if token := schema.get("Properties", "ServiceToken"); token.tag() != "!GetAtt" || token.str() != "MigrateFunction.Arn" {
		t.Errorf("OutboxSchema's ServiceToken must be the migrate function")
	}
	if v := schema.get("Properties", "MigrateFunctionVersion"); v.tag() != "!Ref" || v.str() != "MigrateFunction.Version" {
		t.Errorf("OutboxSchema must change with the migrate function's published version, or a release's new migrations are never applied")
	}
	fn := tpl.get("Resources", "MigrateFunction", "Properties")
	if fn.get("AutoPublishAlias").str() == "" {
		t.Errorf("MigrateFunction needs AutoPublishAlias: MigrateFunction.Version exists only with it")
	}
	if fn.get("VpcConfig").Node != nil {
		t.Errorf("MigrateFunction must take the functions' VpcConfig from Globals, to reach the same database")
	}
	if tpl.get("Parameters", "MigrateOnDeploy", "Default").str() != "true" {
		t.Errorf("MigrateOnDeploy must default to true")
	}
	// The schema owner's credentials, or else the functions'.
	env := fn.get("Environment", "Variables")
	for variable, want := range map[string]string{
		"OUTBOX_DB_SECRET_ARN": "HasMigrationSecret MigrationDatabaseSecretArn DatabaseSecretArn",
		"OUTBOX_DB_USER":       "HasMigrationUser MigrationDatabaseUser DatabaseUser",
	} {
		if got := strings.Join(scalars(env.get(variable)), " "); env.get(variable).tag() != "!If" || got != want {
			t.Errorf("MigrateFunction's %s = %s, want !If [%s]", variable, got, want)
		}
	}
	// The function's timeout bounds the migrations; the statement timeout
	// must end a statement before it, so that the answer is FAILED, not none.
	if fn.get("Timeout").str() != "900" || env.get("OUTBOX_DB_STATEMENT_TIMEOUT").str() != "14m" {
		t.Errorf("MigrateFunction: timeout %s and statement timeout %s, want 900 and 14m",
			fn.get("Timeout").str(), env.get("OUTBOX_DB_STATEMENT_TIMEOUT").str())
	}
	var policies strings.Builder
	for _, s := range scalars(fn.get("Policies")) {
		policies.WriteString(s + " ")
	}
	for _, want := range []string{"MigrationDatabaseSecretArn", "DatabaseSecretArn", "rds-db:connect", "${MigrationDatabaseUser}", "${DatabaseUser}"} {
		if !strings.Contains(policies.String(), want) {
			t.Errorf("MigrateFunction's policies do not mention %s", want)
		}
	}
	if out := tpl.get("Outputs", "MigrateStatusCommand", "Value"); out.tag() != "!Sub" || !strings.Contains(out.str(), "${MigrateFunction}") {
		t.Errorf("MigrateStatusCommand must name the deployed migrate function")
	}
}

// A release's functions may need its migrations: with MigrateOnDeploy each
// runtime function refers to OutboxSchema (inside Fn::If on the condition,
// since DependsOn cannot be conditional), so CloudFormation updates it only
// after the migrations succeeded.
func TestRuntimeFunctionsWaitForTheSchema(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	for _, name := range []string{"DispatchFunction", "ReaperFunction", "DlqReplayFunction", "MetricsFunction"} {
		desc := tpl.get("Resources", name, "Properties", "Description")
		got := scalars(desc)
		if desc.tag() != "!If" || len(got) < 1 || got[0] != "MigrateOnDeploy" || !strings.Contains(strings.Join(got, " "), "${OutboxSchema.Version}") {
			t.Errorf("%s does not refer to OutboxSchema under MigrateOnDeploy: it may start with a release's code before its migrations", name)
		}
	}
	if tpl.get("Resources", "MigrateFunction", "Properties", "Description").tag() == "!If" {
		t.Errorf("MigrateFunction must not refer to OutboxSchema, which calls it")
	}
}
