// Package config reads the environment; nothing else does. It holds the
// registry of the OUTBOX_* variables — every name, default, limit and line
// of documentation, in one place — and turns the environment into the
// typed configuration of each function: Reaper, Replay and Metrics here,
// and in its part for the dispatch function, package dispatchconfig,
// Dispatch and outboxctl serve's Serve. Each is composed of the
// components' own configurations (dbpool.Config, tracing.Config, the log
// level, and in dispatchconfig dispatch.Config and the parsed route.Table);
// the components never see a variable's name.
//
//	cfg, err := config.LoadReaper(config.OS())
//	if err != nil {
//		handler.FailInit("reaper", err) // every problem, one per line, each naming its variable
//	}
//	h, closeFn, err := reaperfn.New(ctx, cfg, handler.Deps{})
//
// The dispatch function's part is apart so that the other functions do
// not link the routes' JSON Schema library, whose package initialisation
// every cold start would pay; for the same reason the dispatch engine's
// defaults and limits are declared here (DefaultBatchSize, MaxBatchSize, …)
// and shared/dispatch refers to them, not the other way round.
//
// # Problems
//
// A load reads everything it needs before it reports, so that a bad
// deployment fails its cold start once, with every problem: one line per
// variable, naming it. The database problems come on one line from
// dbpool, "dbpool: invalid database configuration: VARIABLE: problem; …";
// the routes' from route, one per line after a line naming OUTBOX_ROUTES
// or OUTBOX_ROUTES_FILE and the file.
//
// Where a component checks a combination of settings itself (a lease
// longer than the safety margin, exactly one database source), this
// package hands it the variables' names (dispatch.Names, dbpool.Names) for
// its messages.
//
// # The Lambda runtime's variables
//
// AWS_LAMBDA_FUNCTION_NAME, AWS_LAMBDA_FUNCTION_MEMORY_SIZE,
// AWS_LAMBDA_INITIALIZATION_TYPE, AWS_LAMBDA_LOG_LEVEL and
// AWS_LAMBDA_RUNTIME_API are read here too, once per cold start, and
// _X_AMZN_TRACE_ID, which the runtime sets for each invocation, through the
// function that logging.Lambda and tracing.Config call. Go's own GOGC and
// GOMEMLIMIT are read only to leave them as the deployer set them: without
// them a function's collector gets a soft limit from its memory size
// (MemoryLimit) and a pace of FunctionGCPercent (GCPercent).
//
// # Tracing
//
// Tracing is enabled when, in this order:
//
//  1. OUTBOX_TRACING is off, false, 0 or disabled: never. An unknown value
//     also disables it (and the tracer's Reason says why).
//  2. AWS_XRAY_SDK_DISABLED is true: never (the SDK would emit nothing).
//  3. OUTBOX_TRACING is on, true or 1: always, to the daemon at
//     AWS_XRAY_DAEMON_ADDRESS or the SDK's default, 127.0.0.1:2000.
//  4. Otherwise (unset or auto): when AWS_XRAY_DAEMON_ADDRESS or
//     _X_AMZN_TRACE_ID is set — that is, on Lambda, where the platform runs
//     the daemon and sets its address, or next to a local daemon.
//
// # Documentation cannot drift
//
// docs/CONFIGURATION.md's settings reference is generated from Variables and
// checked by a test; another test parses the module and fails when an
// OUTBOX_* variable is read outside this package and dispatchconfig, or in
// both (the test harness's OUTBOX_TEST_* variables are read by
// shared/testkit/pgtest alone), or when a registered variable is read nowhere.
package config
