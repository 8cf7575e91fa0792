// Package infra_test checks the deployment template's structure: the
// functions, their runtime and build, schedules without async retries,
// least-privilege policies without wildcard resources, the alarms and the
// dashboard. cfn-lint checks it against CloudFormation's own rules when it
// is installed.
package infra_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// node wraps a YAML node with map-style access; CloudFormation's short-form
// intrinsics (!Ref, !If, ...) stay visible as node tags.
type node struct{ *yaml.Node }

func (n node) get(path ...string) node {
	cur := n.Node
	for _, key := range path {
		if cur == nil || cur.Kind != yaml.MappingNode {
			return node{}
		}
		var next *yaml.Node
		for i := 0; i+1 < len(cur.Content); i += 2 {
			if cur.Content[i].Value == key {
				next = cur.Content[i+1]
			}
		}
		cur = next
	}
	return node{cur}
}

func (n node) str() string {
	if n.Node == nil {
		return ""
	}
	return n.Value
}

func (n node) keys() []string {
	var out []string
	if n.Node != nil && n.Kind == yaml.MappingNode {
		for i := 0; i < len(n.Content); i += 2 {
			out = append(out, n.Content[i].Value)
		}
	}
	return out
}

// walk visits every node under n with the mapping key that led to it.
func walk(n *yaml.Node, key string, visit func(key string, n *yaml.Node)) {
	if n == nil {
		return
	}
	visit(key, n)
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			walk(n.Content[i+1], n.Content[i].Value, visit)
		}
	case yaml.SequenceNode, yaml.DocumentNode:
		for _, c := range n.Content {
			walk(c, key, visit)
		}
	}
}

func load(t *testing.T) node {
	t.Helper()
	raw, err := os.ReadFile("../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("template.yaml is not YAML: %v", err)
	}
	return node{doc.Content[0]}
}

var functions = map[string]string{
	"DispatchFunction":  "dispatch",
	"ReaperFunction":    "reaper",
	"DlqReplayFunction": "dlq-replay",
	"MetricsFunction":   "metrics",
}

func TestFunctionsRuntimeAndBuild(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	if tpl.get("Transform").str() != "AWS::Serverless-2016-10-31" {
		t.Fatal("not a SAM template")
	}
	g := tpl.get("Globals", "Function")
	for key, want := range map[string]string{"Runtime": "provided.al2023", "Handler": "bootstrap", "Tracing": "Active"} {
		if got := g.get(key).str(); got != want {
			t.Errorf("Globals.Function.%s = %q, want %q", key, got, want)
		}
	}
	if arch := g.get("Architectures"); arch.Node == nil || len(arch.Content) != 1 || arch.Content[0].Value != "arm64" {
		t.Errorf("Globals.Function.Architectures must be [arm64]")
	}
	if g.get("LoggingConfig", "LogFormat").str() != "JSON" {
		t.Errorf("functions must log in JSON format")
	}
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, name := range tpl.get("Resources").keys() {
		r := tpl.get("Resources", name)
		if r.get("Type").str() != "AWS::Serverless::Function" {
			continue
		}
		found = append(found, name)
		dir, ok := functions[name]
		if !ok {
			t.Errorf("unexpected function %s", name)
			continue
		}
		if r.get("Metadata", "BuildMethod").str() != "makefile" {
			t.Errorf("%s: BuildMethod must be makefile so that sam build uses the project's flags", name)
		}
		target := "build-" + name + ":"
		i := bytes.Index(makefile, []byte(target))
		if i < 0 || !bytes.Contains(makefile[i:min(len(makefile), i+200)], []byte(dir+")")) {
			t.Errorf("Makefile has no %s target building ./functions/%s", target, dir)
		}
		if _, err := os.Stat("../functions/" + dir + "/main.go"); err != nil {
			t.Errorf("%s: functions/%s/main.go: %v", name, dir, err)
		}
	}
	if len(found) != len(functions) {
		t.Errorf("functions %v, want %d", found, len(functions))
	}
}

func TestSchedulesRetryNothing(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	for name := range functions {
		r := tpl.get("Resources", name, "Properties")
		events := r.get("Events")
		if name == "DlqReplayFunction" {
			if events.Node != nil {
				t.Errorf("the replay function must not be scheduled")
			}
			continue
		}
		tick := events.get("Tick")
		if tick.get("Type").str() != "ScheduleV2" {
			t.Errorf("%s: Events.Tick must be a ScheduleV2 schedule", name)
		}
		if tick.get("Properties", "ScheduleExpression").Tag != "!Ref" {
			t.Errorf("%s: the schedule expression must be a parameter", name)
		}
		if tick.get("Properties", "RetryPolicy", "MaximumRetryAttempts").str() != "0" {
			t.Errorf("%s: the schedule must not retry (the next tick does)", name)
		}
		if r.get("EventInvokeConfig", "MaximumRetryAttempts").str() != "0" {
			t.Errorf("%s: asynchronous retries must be off", name)
		}
		if in := tick.get("Properties", "Input").str(); in != "{}" {
			t.Errorf("%s: schedule input %q, want {}", name, in)
		}
	}
}

// checkStatements fails every way a policy could grant more than the named
// resources: a wildcard resource or action, NotResource or NotAction, an
// AWS managed policy, or a SAM policy template given "*".
func checkStatements(t *testing.T, owner string, policies *yaml.Node) (resources int) {
	t.Helper()
	if policies != nil && policies.Kind == yaml.SequenceNode {
		for _, item := range policies.Content {
			switch {
			case item.Kind == yaml.ScalarNode && item.Tag != "!Ref":
				t.Errorf("%s: managed policy %q grants more than the listed resources; use inline statements", owner, item.Value)
			case item.Kind == yaml.MappingNode && len(item.Content) == 2 && item.Content[0].Value != "Statement" && item.Content[0].Value != "Fn::If":
				t.Errorf("%s: SAM policy template %s: use inline statements with named resources", owner, item.Content[0].Value)
			}
		}
	}
	walk(policies, "Policies", func(key string, n *yaml.Node) {
		switch key {
		case "NotResource", "NotAction", "NotPrincipal":
			t.Errorf("%s: %s grants everything but a list", owner, key)
		case "Resource":
			resources++
			walk(n, key, func(_ string, v *yaml.Node) {
				if v.Kind == yaml.ScalarNode && strings.Contains(v.Value, "*") {
					t.Errorf("%s: Resource %q contains a wildcard", owner, v.Value)
				}
			})
		case "Action":
			walk(n, key, func(_ string, v *yaml.Node) {
				if v.Kind == yaml.ScalarNode && strings.Contains(v.Value, "*") {
					t.Errorf("%s: Action %q is a wildcard", owner, v.Value)
				}
			})
		}
	})
	return resources
}

// No statement may name every resource, nor every action of a service: the
// functions get exactly the topics, buses, functions and secrets configured.
func TestPoliciesHaveNoWildcards(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	var statements int
	for name := range functions {
		statements += checkStatements(t, name, tpl.get("Resources", name, "Properties", "Policies").Node)
	}
	if statements < 6 {
		t.Errorf("only %d policy statements found: the walk missed them", statements)
	}
	// Roles and policies declared outside the functions get the same rules.
	for _, name := range tpl.get("Resources").keys() {
		r := tpl.get("Resources", name)
		if strings.HasPrefix(r.get("Type").str(), "AWS::IAM::") {
			checkStatements(t, name, r.get("Properties").Node)
			if arns := r.get("Properties", "ManagedPolicyArns"); arns.Node != nil {
				t.Errorf("%s: managed policies grant more than the listed resources", name)
			}
		}
	}
	dispatch := tpl.get("Resources", "DispatchFunction", "Properties", "Policies")
	var text strings.Builder
	walk(dispatch.Node, "", func(_ string, n *yaml.Node) { fmt.Fprintf(&text, "%s %s\n", n.Tag, n.Value) })
	for _, want := range []string{"sns:Publish", "events:PutEvents", "lambda:InvokeFunction", "secretsmanager:GetSecretValue", "rds-db:connect", "SnsTopicArns", "EventBusArns", "PluginFunctionArns"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the dispatch policies do not mention %s", want)
		}
	}
}

func TestAlarmsAndDashboard(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	res := tpl.get("Resources")
	wantMetric := map[string]string{
		"OldestPendingAgeAlarm":      "OldestPendingAgeSeconds",
		"DeadLetterDepthRisingAlarm": "DeadLetterDepth",
		"ExpiredLeasesAlarm":         "ExpiredLeases",
		"BlockedKeyAlarm":            "OldestBlockedKeyAgeSeconds",
		"ConfigurationErrorAlarm":    "Held",
		"RetryRateSpikeAlarm":        "Retried",
		"DispatchErrorsAlarm":        "Errors",
		"DispatchThrottlesAlarm":     "Throttles",
	}
	for alarm, metric := range wantMetric {
		r := res.get(alarm)
		if r.get("Type").str() != "AWS::CloudWatch::Alarm" {
			t.Errorf("alarm %s missing", alarm)
			continue
		}
		var text strings.Builder
		walk(r.Node, "", func(_ string, n *yaml.Node) { text.WriteString(n.Value + " ") })
		if !strings.Contains(text.String(), metric) {
			t.Errorf("%s does not watch %s", alarm, metric)
		}
		if r.get("Properties", "AlarmActions").Node == nil {
			t.Errorf("%s has no alarm actions", alarm)
		}
		if len(r.get("Properties", "AlarmDescription").str()) < 40 {
			t.Errorf("%s needs a description that tells the operator what to do", alarm)
		}
	}
	if n, _ := strconv.Atoi(res.get("ExpiredLeasesAlarm", "Properties", "DatapointsToAlarm").str()); n < 3 {
		t.Error("expired leases must persist for several periods before alarming")
	}
	body := res.get("Dashboard", "Properties", "DashboardBody")
	var text strings.Builder
	walk(body.Node, "", func(_ string, n *yaml.Node) { text.WriteString(n.Value + "\n") })
	for _, metric := range []string{"PendingDepth", "OldestPendingAgeSeconds", "Delivered", "DispatchLatency", "DeadLetterDepth", "ExpiredLeases", "BlockedKeys", "OldestBlockedKeyAgeSeconds", "Released"} {
		if !strings.Contains(text.String(), `"`+metric+`"`) {
			t.Errorf("the dashboard has no %s widget", metric)
		}
	}
	if res.get("MetricsFunction", "Properties", "Events", "Tick", "Type").str() != "ScheduleV2" {
		t.Error("the metrics function must run on a schedule")
	}
}

// Every metric the template watches is one the code emits.
func TestWatchedMetricsAreEmitted(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var code strings.Builder
	for _, dir := range []string{"../shared/handler", "../shared/handler/dispatchfn"} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".go") && !strings.HasSuffix(e.Name(), "_test.go") {
				b, _ := os.ReadFile(dir + "/" + e.Name())
				code.Write(b)
			}
		}
	}
	seen := 0
	metric := regexp.MustCompile(`(?:MetricName: |\["Outbox", "|\[\s*"\.", ")([A-Z][A-Za-z]+)`)
	for _, m := range metric.FindAllStringSubmatch(string(raw), -1) {
		name := m[1]
		if name == "Errors" || name == "Throttles" || name == "Duration" {
			continue // AWS/Lambda's own
		}
		seen++
		if !strings.Contains(code.String(), `"`+name+`"`) {
			t.Errorf("template.yaml watches %s, which no handler emits", name)
		}
	}
	if seen < 10 {
		t.Errorf("found only %d watched metrics: the pattern no longer matches the template", seen)
	}
}

func TestCfnLint(t *testing.T) {
	t.Parallel()
	path, err := exec.LookPath("cfn-lint")
	if err != nil {
		t.Skip("cfn-lint is not on the PATH: template.yaml was not checked against CloudFormation's rules")
	}
	out, err := exec.Command(path, "../template.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("cfn-lint template.yaml: %v\n%s", err, out)
	}
}

// The parameters that name the resources the policies grant cannot be given
// a wildcard at deploy time.
func TestResourceParametersRefuseWildcards(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	good := map[string]string{
		"SnsTopicArns":       "arn:aws:sns:eu-west-1:123456789012:payments.fifo",
		"EventBusArns":       "arn:aws:events:eu-west-1:123456789012:event-bus/default",
		"PluginFunctionArns": "arn:aws:lambda:eu-west-1:123456789012:function:audit-sink",
		"WebhookSecretArns":  "arn:aws:secretsmanager:eu-west-1:123456789012:secret:billing-hook-AbCdEf",
		"DatabaseSecretArn":  "arn:aws:secretsmanager:eu-west-1:123456789012:secret:outbox-db-AbCdEf",
		"DatabaseResourceId": "db-ABCDEFGHIJKLMNOP",
		"DatabaseUser":       "outbox_lambda",
	}
	for param, example := range good {
		pattern := tpl.get("Parameters", param, "AllowedPattern").str()
		if pattern == "" {
			t.Errorf("parameter %s has no AllowedPattern", param)
			continue
		}
		re, err := regexp.Compile(pattern)
		if err != nil {
			t.Errorf("parameter %s: AllowedPattern does not compile: %v", param, err)
			continue
		}
		if !re.MatchString(example) || !re.MatchString("") {
			t.Errorf("parameter %s refuses %q or the empty default", param, example)
		}
		for _, bad := range []string{"*", "arn:aws:sns:*:*:*", strings.Replace(example, "123456789012", "*", 1), example[:len(example)-3] + "*"} {
			if bad != example && re.MatchString(bad) {
				t.Errorf("parameter %s accepts the wildcard %q", param, bad)
			}
		}
	}
}
