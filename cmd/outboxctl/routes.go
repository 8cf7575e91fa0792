package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/route"
)

func newRoutesCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "routes check FILE",
		Short: "Check a routes file, and list the ARNs the template's parameters must grant",
	}
	cmd.AddCommand(newRoutesCheckCommand(g))
	return cmd
}

func newRoutesCheckCommand(g *globalOptions) *cobra.Command {
	var (
		region, account, partition string
		asJSON, overridesOnly      bool
	)
	cmd := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a routes file as the dispatch function does, and print the ARNs the template must grant",
		Long: `Validate a routes file (JSON or YAML; - for stdin) with the dispatch
function's own decoder and limits (OUTBOX_ATTEMPT_CEILING from the
environment, as the function reads it), then print what the stack's
parameters must list for the function to be allowed to deliver: the SNS
topics (SnsTopicArns), EventBridge buses (EventBusArns), plugin Lambda
functions (PluginFunctionArns), webhook signing secrets
(WebhookSecretArns) and the bucket of offloading routes (OffloadBucket),
comma-separated, and the same as one
--parameter-overrides argument for sam deploy.

A bus or function named by name rather than ARN gets its ARN from --region
and --account-id (default $AWS_REGION and REGION, ACCOUNT_ID placeholders
to replace). Signing secrets read from environment variables
(signing_secret_env) are listed too: set them on the dispatch function.
KmsKeyArns, the keys of encrypted topics, buses and secrets, cannot be
known from the routes.

An invalid file exits 1 with each problem on its own line.`,
		Example: `  outboxctl routes check routes.yaml
  outboxctl routes check routes.json --region eu-west-1 --account-id 123456789012
  sam deploy --parameter-overrides "$(outboxctl routes check routes.json --parameter-overrides)"`,
		Args: exactArgs(1, "a routes file (JSON or YAML, or - for stdin)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			file := args[0]
			var (
				data []byte
				err  error
			)
			if file == "-" {
				data, err = io.ReadAll(cmd.InOrStdin())
			} else {
				data, err = os.ReadFile(file)
			}
			if err != nil {
				return usagef("routes file %s: %v", file, cause(err))
			}
			r := config.NewReader(g.env())
			ceiling := config.AttemptCeiling(r)
			if err := r.Err(); err != nil {
				return usageError{err}
			}
			table, err := route.Parse(data, route.Options{AttemptCeiling: ceiling})
			if err != nil {
				if ce, ok := errors.AsType[*route.ConfigError](err); ok {
					ce.Source = file
				}
				return err
			}
			if region == "" {
				region = g.getenv("AWS_REGION")
			}
			grants := grantsOf(table, arnContext{partition: partition, region: region, account: account})
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, grants)
			}
			if overridesOnly {
				_, err := fmt.Fprintln(out, grants.parameterOverrides())
				return err
			}
			printGrants(out, file, len(table.Routes), grants)
			return nil
		},
	}
	cmd.Flags().StringVar(&region, "region", "", "region of buses and functions named without an ARN (default $AWS_REGION, else REGION)")
	cmd.Flags().StringVar(&account, "account-id", "", "account of buses and functions named without an ARN (default ACCOUNT_ID)")
	cmd.Flags().StringVar(&partition, "partition", "aws", "partition of the ARNs built from names (aws-cn, aws-us-gov)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the parameters as JSON")
	cmd.Flags().BoolVar(&overridesOnly, "parameter-overrides", false, "print only the sam deploy --parameter-overrides argument")
	return cmd
}

// routeGrants are what the template's parameters must list for the
// dispatch function to reach every target of a routes file.
type routeGrants struct {
	SnsTopicArns       []string `json:"SnsTopicArns"`
	EventBusArns       []string `json:"EventBusArns"`
	PluginFunctionArns []string `json:"PluginFunctionArns"`
	WebhookSecretArns  []string `json:"WebhookSecretArns"`
	// OffloadBuckets are the buckets of the routes' offload option: the
	// template's OffloadBucket grants one.
	OffloadBuckets []string `json:"OffloadBucket,omitempty"`
	// SigningSecretEnv names the variables of signing_secret_env: the
	// dispatch function's environment must set them.
	SigningSecretEnv []string `json:"signing_secret_env,omitempty"`
}

// arnContext completes the ARNs of targets named without one.
type arnContext struct{ partition, region, account string }

func (c arnContext) orPlaceholders() arnContext {
	if c.partition == "" {
		c.partition = "aws"
	}
	if c.region == "" {
		c.region = "REGION"
	}
	if c.account == "" {
		c.account = "ACCOUNT_ID"
	}
	return c
}

func grantsOf(t *route.Table, c arnContext) routeGrants {
	c = c.orPlaceholders()
	g := routeGrants{SnsTopicArns: []string{}, EventBusArns: []string{}, PluginFunctionArns: []string{}, WebhookSecretArns: []string{}}
	add := func(list *[]string, v string) {
		if v != "" && !slices.Contains(*list, v) {
			*list = append(*list, v)
		}
	}
	for _, target := range t.Targets() {
		switch target.Type {
		case "sns":
			add(&g.SnsTopicArns, target.TopicARN)
		case "eventbridge":
			add(&g.EventBusArns, busARN(target.EventBus, c))
		case "lambda":
			add(&g.PluginFunctionArns, functionARN(target.Function, c))
		case "http":
			add(&g.WebhookSecretArns, target.SigningSecretARN)
			add(&g.SigningSecretEnv, target.SigningSecretEnv)
		}
		add(&g.OffloadBuckets, target.Offload.Bucket)
	}
	return g
}

// busARN is an EventBridge bus's ARN: as given, or built from its name.
func busARN(bus string, c arnContext) string {
	if strings.HasPrefix(bus, "arn:") {
		return bus
	}
	return fmt.Sprintf("arn:%s:events:%s:%s:event-bus/%s", c.partition, c.region, c.account, bus)
}

// functionARN is a Lambda function's ARN, with its qualifier, from any of
// the forms Lambda's Invoke accepts: a name (my-fn, my-fn:live), a partial
// ARN (123456789012:function:my-fn) or an ARN.
func functionARN(fn string, c arnContext) string {
	switch parts := strings.Split(fn, ":"); {
	case strings.HasPrefix(fn, "arn:"):
		return fn
	case len(parts) >= 3 && parts[1] == "function":
		return fmt.Sprintf("arn:%s:lambda:%s:%s", c.partition, c.region, fn)
	default:
		return fmt.Sprintf("arn:%s:lambda:%s:%s:function:%s", c.partition, c.region, c.account, fn)
	}
}

// parameters are the template's parameter names and values, in the
// template's order.
func (g routeGrants) parameters() [][2]string {
	return [][2]string{
		{"SnsTopicArns", strings.Join(g.SnsTopicArns, ",")},
		{"EventBusArns", strings.Join(g.EventBusArns, ",")},
		{"PluginFunctionArns", strings.Join(g.PluginFunctionArns, ",")},
		{"WebhookSecretArns", strings.Join(g.WebhookSecretArns, ",")},
		{"OffloadBucket", strings.Join(g.OffloadBuckets, ",")},
	}
}

// parameterOverrides is the sam deploy --parameter-overrides argument
// (empty parameters left out, so that samconfig.toml's stay).
func (g routeGrants) parameterOverrides() string {
	var parts []string
	for _, p := range g.parameters() {
		if p[1] != "" {
			parts = append(parts, fmt.Sprintf("%s=%q", p[0], p[1]))
		}
	}
	return strings.Join(parts, " ")
}

func printGrants(w io.Writer, file string, routes int, g routeGrants) {
	fmt.Fprintf(w, "%s: %d route%s, valid\n\n", file, routes, plural(routes))
	fmt.Fprintln(w, "The stack's parameters must list (comma-separated):")
	for _, p := range g.parameters() {
		fmt.Fprintf(w, "  %s=%s\n", p[0], p[1])
	}
	if overrides := g.parameterOverrides(); overrides != "" {
		fmt.Fprintf(w, "\nsam deploy --parameter-overrides %s\n", overrides)
	}
	all := strings.Join(slices.Concat(g.EventBusArns, g.PluginFunctionArns), " ")
	if strings.Contains(all, ":REGION:") || strings.Contains(all, ":ACCOUNT_ID:") {
		fmt.Fprintln(w, "\nReplace REGION and ACCOUNT_ID, or pass --region and --account-id: the routes name some buses or functions without an ARN.")
	}
	if len(g.SigningSecretEnv) > 0 {
		fmt.Fprintf(w, "\nThe dispatch function's environment must set %s (signing_secret_env).\n", strings.Join(g.SigningSecretEnv, ", "))
	}
	if len(g.OffloadBuckets) > 1 {
		fmt.Fprintf(w, "\nThe routes offload to %d buckets, but OffloadBucket grants one: use one bucket (a prefix per route), or grant the others yourself.\n", len(g.OffloadBuckets))
	}
	fmt.Fprintln(w, "\nKmsKeyArns must list the keys of SSE-KMS topics, buses and secrets; the routes do not say which.")
}
