package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
	"github.com/outboxkit/dispatcher/shared/handler/metricsfn"
	"github.com/outboxkit/dispatcher/shared/handler/migratefn"
	"github.com/outboxkit/dispatcher/shared/handler/reaperfn"
	"github.com/outboxkit/dispatcher/shared/handler/replayfn"
)

// invocable is one function's handler, built from the environment as its
// main package builds it at a cold start.
type invocable func(ctx context.Context, env config.Env, deps handler.Deps) (handle func(context.Context, json.RawMessage) (any, error), closeFn func(), err error)

// build reads a function's configuration with load and builds its handler
// with newHandler, as the function's main package does.
func build[C any, H any, A any](load func(config.Env) (C, error), newHandler func(context.Context, C, handler.Deps) (H, func(), error),
	handle func(H, context.Context, json.RawMessage) (A, error)) invocable {
	return func(ctx context.Context, env config.Env, deps handler.Deps) (func(context.Context, json.RawMessage) (any, error), func(), error) {
		cfg, err := load(env)
		if err != nil {
			return nil, nil, err
		}
		h, closeFn, err := newHandler(ctx, cfg, deps)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, raw json.RawMessage) (any, error) { return handle(h, ctx, raw) }, closeFn, nil
	}
}

// functions are the Lambda functions invoke can run, by their names in
// functions/ and template.yaml.
var functions = map[string]invocable{
	"dispatch":   build(dispatchconfig.Load, dispatchfn.New, (*dispatchfn.Handler).Handle),
	"reaper":     build(config.LoadReaper, reaperfn.New, (*reaperfn.Handler).Handle),
	"dlq-replay": build(config.LoadReplay, replayfn.New, (*replayfn.Handler).Handle),
	"metrics":    build(config.LoadMetrics, metricsfn.New, (*metricsfn.Handler).Handle),
	"migrate": build(config.LoadFunction, func(_ context.Context, cfg config.Function, deps handler.Deps) (*migratefn.Handler, func(), error) {
		h, closeFn := migratefn.New(cfg, nil, deps)
		return h, closeFn, nil
	}, (*migratefn.Handler).Handle),
}

func functionNames() string {
	names := make([]string, 0, len(functions))
	for name := range functions {
		names = append(names, name)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func newInvokeCommand(g *globalOptions) *cobra.Command {
	var (
		eventFile string
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "invoke FUNCTION [--event FILE]",
		Short: "Run a function's handler in-process, as the Lambda would, and print its answer",
		Long: `Run one invocation of a function's handler in this process: the handler is
built from the environment exactly as the function builds it at a cold start
(OUTBOX_* variables, the routes for dispatch, the AWS SDK's own settings),
given the event, and its JSON answer is printed on stdout. Its logs and
metrics documents go to stderr.

FUNCTION is one of dispatch, reaper, dlq-replay, metrics, migrate. The event
comes from --event (a file, or - for stdin); by default it is the function's
schedule event, {} (events/<function>-schedule.json). dlq-replay has no
schedule: give it an event, e.g. events/dlq-replay-dry-run.json. migrate's
{} applies the pending migrations, as the stack's custom resource has it do;
events/migrate-status.json lists them.

Before dispatch runs, it warns of each namespace/topic with pending messages
that no route matches: dispatch holds those as NO_ROUTE (retried with a
capped backoff, never delivered) until a route covers them.`,
		Example: `  outboxctl invoke reaper
  outboxctl invoke metrics
  outboxctl invoke migrate --event events/migrate-status.json
  OUTBOX_ROUTES_FILE=routes.yaml outboxctl invoke dispatch --event events/dispatch-overrides.json
  outboxctl invoke dlq-replay --event events/dlq-replay-dry-run.json
  echo '{"namespace":"billing","dry_run":true}' | outboxctl invoke dlq-replay --event -`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("invoke needs a function: %s", functionNames())
			}
			if functions[args[0]] == nil {
				if near := suggest(args[0], strings.Split(functionNames(), ", ")); len(near) > 0 {
					return usagef("unknown function %q: did you mean %s?", args[0], orList(near))
				}
				return usagef("unknown function %q: use %s", args[0], functionNames())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if timeout <= 0 {
				return usagef("--timeout must be positive, got %s", timeout)
			}
			event, err := readEvent(cmd, name, eventFile)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if name == "dispatch" {
				warnUnroutedPending(ctx, cmd.ErrOrStderr(), g)
			}
			handle, closeFn, err := functions[name](ctx, g.env(), handler.Deps{Stdout: cmd.ErrOrStderr()})
			if err != nil {
				// What would fail the function's cold start: its
				// configuration, or its database.
				return fmt.Errorf("%s: cold start failed: %w", name, err)
			}
			defer closeFn()
			// Lambda gives every invocation a deadline; the handlers plan
			// their work (when to stop claiming) by it.
			invokeCtx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			answer, err := handle(invokeCtx, event)
			var evErr *handler.EventError
			if errors.As(err, &evErr) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			return writeJSON(cmd.OutOrStdout(), answer)
		},
	}
	cmd.Flags().StringVar(&eventFile, "event", "", "the event: a JSON file, or - for stdin (default: the schedule event, {})")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "the invocation's deadline, as the function's timeout")
	return cmd
}

func readEvent(cmd *cobra.Command, function, file string) (json.RawMessage, error) {
	var (
		raw []byte
		err error
	)
	switch file {
	case "":
		if function == "dlq-replay" {
			return nil, usagef("dlq-replay has no schedule event: pass --event FILE, e.g. events/dlq-replay-dry-run.json")
		}
		return json.RawMessage(`{}`), nil
	case "-":
		raw, err = io.ReadAll(cmd.InOrStdin())
	default:
		raw, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, usagef("--event %s: %v", file, cause(err))
	}
	if !json.Valid(raw) {
		return nil, usagef("--event %s is not valid JSON", file)
	}
	return raw, nil
}
