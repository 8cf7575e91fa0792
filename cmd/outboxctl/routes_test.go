package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// A routes file with one target of each kind, naming a bus and a function
// by name, as operators write them.
const routesFileYAML = `routes:
  - match: {namespace: billing, topic: "*"}
    target: {type: http, url: "https://billing.internal/usage", signing_secret_env: BILLING_SECRET}
  - match: {namespace: refunds, topic: "*"}
    target: {type: http, url: "https://refunds.internal/hook", signing_secret_arn: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:refunds-AbCdEf"}
  - match: {namespace: payments, topic: "*"}
    target: {type: sns, topic_arn: "arn:aws:sns:eu-west-1:123456789012:payments.fifo"}
  - match: {namespace: payments, topic: refund}
    target: {type: sns, topic_arn: "arn:aws:sns:eu-west-1:123456789012:payments.fifo", message_group_id: refunds}
  - match: {namespace: "*", topic: "*"}
    target: {type: eventbridge, event_bus: default}
  - match: {namespace: audit, topic: "*"}
    target: {type: lambda, function: "audit-sink:live"}
  - match: {namespace: audit, topic: export}
    target: {type: lambda, function: "arn:aws:lambda:eu-west-1:123456789012:function:exporter"}
  - match: {namespace: billing, topic: invoice}
    offload: {bucket: acme-outbox-payloads}
    target: {type: sns, topic_arn: "arn:aws:sns:eu-west-1:123456789012:invoices"}
`

func writeRoutesFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// routes check prints, for a valid file, every ARN the template's
// parameters must list, each once, in a form the template accepts.
func TestRoutesCheckListsWhatTheTemplateMustGrant(t *testing.T) {
	t.Parallel()
	path := writeRoutesFile(t, "routes.yaml", routesFileYAML)
	env := invocation{env: map[string]string{}}
	want := routeGrants{
		SnsTopicArns:       []string{"arn:aws:sns:eu-west-1:123456789012:payments.fifo", "arn:aws:sns:eu-west-1:123456789012:invoices"},
		EventBusArns:       []string{"arn:aws:events:eu-west-1:123456789012:event-bus/default"},
		PluginFunctionArns: []string{"arn:aws:lambda:eu-west-1:123456789012:function:audit-sink:live", "arn:aws:lambda:eu-west-1:123456789012:function:exporter"},
		WebhookSecretArns:  []string{"arn:aws:secretsmanager:eu-west-1:123456789012:secret:refunds-AbCdEf"},
		OffloadBuckets:     []string{"acme-outbox-payloads"},
		SigningSecretEnv:   []string{"BILLING_SECRET"},
	}

	r := cli(t, env, "routes", "check", path, "--region", "eu-west-1", "--account-id", "123456789012", "--json")
	var got routeGrants
	if r.err != nil || json.Unmarshal([]byte(r.out), &got) != nil {
		t.Fatalf("routes check --json: %v\n%s", r.err, r.out)
	}
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("routes check --json:\n got %s\nwant %s", gotJSON, wantJSON)
	}

	// Each value must pass the template's own AllowedPattern, or sam
	// deploy refuses what was pasted.
	patterns := templateParameterPatterns(t)
	for name, values := range map[string][]string{"SnsTopicArns": got.SnsTopicArns, "EventBusArns": got.EventBusArns,
		"PluginFunctionArns": got.PluginFunctionArns, "WebhookSecretArns": got.WebhookSecretArns, "OffloadBucket": got.OffloadBuckets} {
		p := patterns[name]
		if p == nil {
			t.Fatalf("template.yaml has no AllowedPattern for %s", name)
		}
		for _, v := range values {
			if !p.MatchString(v) {
				t.Errorf("%s value %q does not match the template's AllowedPattern %s", name, v, p)
			}
		}
	}

	cli(t, env, "routes", "check", path, "--region", "eu-west-1", "--account-id", "123456789012").wantOK(t, "routes check",
		"routes.yaml: 8 routes, valid",
		"  SnsTopicArns=arn:aws:sns:eu-west-1:123456789012:payments.fifo,arn:aws:sns:eu-west-1:123456789012:invoices\n",
		"  OffloadBucket=acme-outbox-payloads\n",
		"  PluginFunctionArns=arn:aws:lambda:eu-west-1:123456789012:function:audit-sink:live,arn:aws:lambda:eu-west-1:123456789012:function:exporter\n",
		`sam deploy --parameter-overrides SnsTopicArns="arn:aws:sns:eu-west-1:123456789012:payments.fifo,arn:aws:sns:eu-west-1:123456789012:invoices" EventBusArns=`,
		"must set BILLING_SECRET",
		"KmsKeyArns")
	overrides := cli(t, env, "routes", "check", path, "--region", "eu-west-1", "--account-id", "123456789012", "--parameter-overrides")
	overrides.wantOK(t, "routes check --parameter-overrides", `WebhookSecretArns="arn:aws:secretsmanager:eu-west-1:123456789012:secret:refunds-AbCdEf"`)
	if strings.Count(overrides.out, "\n") != 1 {
		t.Errorf("--parameter-overrides prints more than the one argument:\n%s", overrides.out)
	}

	// Without a region and account, the names get placeholders, and a
	// note says to replace them.
	cli(t, env, "routes", "check", path).wantOK(t, "routes check without --region",
		"EventBusArns=arn:aws:events:REGION:ACCOUNT_ID:event-bus/default", "Replace REGION and ACCOUNT_ID")
	// From stdin, JSON.
	cli(t, invocation{env: map[string]string{}, stdin: `{"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"sns","topic_arn":"arn:aws:sns:us-east-1:123456789012:all"}}]}`},
		"routes", "check", "-").wantOK(t, "routes check -", "-: 1 route, valid", "SnsTopicArns=arn:aws:sns:us-east-1:123456789012:all\n", "EventBusArns=\n")
}

// An invalid file is refused by the dispatch function's own decoder and
// limits, every problem on its own line.
func TestRoutesCheckRefusesAnInvalidFile(t *testing.T) {
	t.Parallel()
	bad := writeRoutesFile(t, "bad.json", `{"routes":[{"match":{"namespace":"a"}},
		{"match":{"namespace":"b","topic":"x"},"target":{"type":"sns","topic_arn":"arn:aws:sns:eu-west-1:123456789012:t"},"retry":{"max_attempts":50}}]}`)
	r := cli(t, invocation{env: map[string]string{"OUTBOX_ATTEMPT_CEILING": "20"}}, "routes", "check", bad)
	r.wantError(t, "routes check bad.json", 1, "route: invalid configuration in "+bad+" (3 problems)")
	if r.err != nil {
		lines := problemLines(r.err)
		want := []string{"routes[0].match.topic", "routes[0].target", "routes[1].retry.max_attempts"}
		if len(lines) != 4 {
			t.Errorf("want a heading and 3 problem lines, got %q", lines)
		}
		for i, w := range want {
			if i+1 < len(lines) && !strings.HasPrefix(lines[i+1], "  "+w) {
				t.Errorf("line %d = %q, want the problem of %s", i+1, lines[i+1], w)
			}
		}
	}
	// The same file is valid under the default ceiling but for the two
	// missing fields.
	cli(t, invocation{env: map[string]string{}}, "routes", "check", bad).wantError(t, "routes check bad.json under the default ceiling", 1, "(2 problems)")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"routes", "check"}, "needs a routes file"},
		{[]string{"routes", "check", "/no/such/routes.yaml"}, "routes file /no/such/routes.yaml: no such file or directory"},
		{[]string{"routes", "chek", "x"}, `unknown routes subcommand "chek": did you mean check?`},
		{[]string{"routes"}, "routes needs a subcommand: check"},
	} {
		cli(t, invocation{env: map[string]string{}}, tc.args...).wantError(t, strings.Join(tc.args, " "), 2, tc.want)
	}
}

// templateParameterPatterns reads template.yaml's parameters'
// AllowedPattern.
func templateParameterPatterns(t *testing.T) map[string]*regexp.Regexp {
	t.Helper()
	raw, err := os.ReadFile("../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Parameters map[string]struct {
			AllowedPattern string `yaml:"AllowedPattern"`
		} `yaml:"Parameters"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("template.yaml: %v", err)
	}
	out := map[string]*regexp.Regexp{}
	for name, p := range doc.Parameters {
		if p.AllowedPattern != "" {
			out[name] = regexp.MustCompile(p.AllowedPattern)
		}
	}
	return out
}
