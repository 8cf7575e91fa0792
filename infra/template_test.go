// Package infra_test checks the deployment template's structure: the
// functions, their runtime and build, schedules without async retries,
// least-privilege policies without wildcard resources, the alarms and the
// dashboard. cfn-lint checks it against CloudFormation's own rules when it
// is installed.
package infra_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
	"github.com/outboxkit/dispatcher/shared/testkit/emftest"
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

// tag is the node's tag ("!Ref", "!Sub", …), "" for a missing node.
func (n node) tag() string {
	if n.Node == nil {
		return ""
	}
	return n.Tag
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

// scalars lists the scalar values under n, in order.
func scalars(n node) []string {
	var out []string
	walk(n.Node, "", func(_ string, v *yaml.Node) {
		if v.Kind == yaml.ScalarNode {
			out = append(out, v.Value)
		}
	})
	return out
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
	"MigrateFunction":   "migrate",
}

func TestFunctionsRuntimeAndBuild(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	if tpl.get("Transform").str() != "AWS::Serverless-2016-10-31" {
		t.Fatal("not a SAM template")
	}
	g := tpl.get("Globals", "Function")
	for key, want := range map[string]string{"Runtime": "provided.al2023", "Handler": "bootstrap"} {
		if got := g.get(key).str(); got != want {
			t.Errorf("Globals.Function.%s = %q, want %q", key, got, want)
		}
	}
	// Tracing is the Tracing parameter's choice, and the functions follow
	// it: with PassThrough they never call the X-Ray SDK.
	if tr := g.get("Tracing"); tr.tag() != "!Ref" || tr.str() != "Tracing" {
		t.Errorf("Globals.Function.Tracing must be !Ref Tracing")
	}
	if p := tpl.get("Parameters", "Tracing"); p.get("Default").str() != "Active" || fmt.Sprint(scalars(p.get("AllowedValues"))) != "[Active PassThrough]" {
		t.Errorf("parameter Tracing: default Active, allowed Active and PassThrough")
	}
	if env := g.get("Environment", "Variables", "OUTBOX_TRACING"); env.tag() != "!If" || fmt.Sprint(scalars(env)) != "[TracingActive auto off]" ||
		fmt.Sprint(scalars(tpl.get("Conditions", "TracingActive"))) != "[Tracing Active]" {
		t.Errorf("OUTBOX_TRACING must be auto when Tracing is Active, else off")
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
		if name == "DlqReplayFunction" || name == "MigrateFunction" {
			if events.Node != nil {
				t.Errorf("%s is invoked by hand (and migrate by the stack's custom resource): it must not be scheduled", name)
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
		if in := tick.get("Properties", "Input").str(); in != "{}" {
			t.Errorf("%s: schedule input %q, want {}", name, in)
		}
	}
}

// Every function's asynchronous invocations — the schedules', and anyone
// invoking with --invocation-type Event — are neither retried nor kept
// longer than a few minutes: the defaults retry twice and keep an event
// six hours, running a stale tick or replay long after it mattered.
func TestAsyncInvocationsExpire(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	for name := range functions {
		cfg := tpl.get("Resources", name, "Properties", "EventInvokeConfig")
		if cfg.get("MaximumRetryAttempts").str() != "0" {
			t.Errorf("%s: asynchronous retries must be off", name)
		}
		age := cfg.get("MaximumEventAgeInSeconds")
		if n, err := strconv.Atoi(age.str()); err != nil || n < 60 || n > 300 {
			t.Errorf("%s: EventInvokeConfig.MaximumEventAgeInSeconds %q, want 60 to 300 (the default is 21600)", name, age.str())
			continue
		}
		// The key's node carries the comment that says why.
		var commented bool
		for i := 0; i+1 < len(cfg.Content); i += 2 {
			if k := cfg.Content[i]; k.Value == "MaximumEventAgeInSeconds" {
				commented = k.HeadComment != "" || k.LineComment != "" || cfg.Content[i+1].LineComment != ""
			}
		}
		if !commented {
			t.Errorf("%s: MaximumEventAgeInSeconds needs a comment giving the reason for its value", name)
		}
	}
}

// offloadObjects are the objects the dispatch function offloads payloads to.
const offloadObjects = "arn:${AWS::Partition}:s3:::${OffloadBucket}/*"

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
				// The one exception: the objects of the named offload bucket,
				// whose keys are message ids, which no policy can list.
				if v.Kind == yaml.ScalarNode && strings.Contains(v.Value, "*") && v.Value != offloadObjects {
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
	for _, want := range []string{"sns:Publish", "events:PutEvents", "lambda:InvokeFunction", "secretsmanager:GetSecretValue", "rds-db:connect", "SnsTopicArns", "EventBusArns", "PluginFunctionArns", "kms:GenerateDataKey", "kms:Decrypt", "KmsKeyArns"} {
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
		"DispatchEventsDroppedAlarm": "AsyncEventsDropped",
		"CircuitOpenAlarm":           "CircuitsOpen",
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
	// shared/handler and each function's package below it.
	err = filepath.WalkDir("../shared/handler", func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			code.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	metric := regexp.MustCompile(`(?:MetricName: |\["\$\{Namespace\}", "|\[\s*"\.", ")([A-Z][A-Za-z]+)`)
	for _, m := range metric.FindAllStringSubmatch(string(raw), -1) {
		name := m[1]
		if name == "Errors" || name == "Throttles" || name == "Duration" || name == "AsyncEventsDropped" {
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
		"KmsKeyArns":         "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
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

// generic turns a YAML node into the shape CloudFormation's JSON has, the
// short-form intrinsics (!Sub, !Ref, …) into their long forms, so that one
// check reads the SAM template and the translated one alike.
func generic(n *yaml.Node) any {
	var v any
	switch n.Kind {
	case yaml.DocumentNode:
		return generic(n.Content[0])
	case yaml.AliasNode:
		return generic(n.Alias)
	case yaml.MappingNode:
		m := map[string]any{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			m[n.Content[i].Value] = generic(n.Content[i+1])
		}
		v = m
	case yaml.SequenceNode:
		l := []any{}
		for _, c := range n.Content {
			l = append(l, generic(c))
		}
		v = l
	default:
		v = n.Value
	}
	switch tag := strings.TrimPrefix(n.Tag, "!"); {
	case !strings.HasPrefix(n.Tag, "!") || strings.HasPrefix(n.Tag, "!!"):
		return v
	case tag == "Ref" || tag == "Condition":
		return map[string]any{tag: v}
	case tag == "GetAtt" && n.Kind == yaml.ScalarNode:
		return map[string]any{"Fn::GetAtt": strings.SplitN(n.Value, ".", 2)}
	default:
		return map[string]any{"Fn::" + tag: v}
	}
}

// namingProperty is the property that gives a resource its physical name,
// or "" for types whose name is not chosen in the template. A type missing
// here fails the test: whoever adds one decides how it is named.
var namingProperty = map[string]string{
	"AWS::Serverless::Function":       "FunctionName",
	"AWS::Lambda::Function":           "FunctionName",
	"AWS::Lambda::EventInvokeConfig":  "",
	"AWS::Lambda::Permission":         "",
	"AWS::Lambda::Version":            "",
	"AWS::Lambda::Alias":              "Name", // scoped by its function
	"AWS::Scheduler::Schedule":        "Name",
	"AWS::Scheduler::ScheduleGroup":   "Name",
	"AWS::Events::Rule":               "Name",
	"AWS::CloudWatch::Alarm":          "AlarmName",
	"AWS::CloudWatch::CompositeAlarm": "AlarmName",
	"AWS::CloudWatch::Dashboard":      "DashboardName",
	"AWS::Logs::LogGroup":             "LogGroupName",
	"AWS::Logs::MetricFilter":         "FilterName", // scoped by its log group
	"AWS::IAM::Role":                  "RoleName",
	"AWS::IAM::Policy":                "", // an inline policy's name is scoped by its role
	"AWS::IAM::ManagedPolicy":         "ManagedPolicyName",
	"AWS::SNS::Topic":                 "TopicName",
	"AWS::SQS::Queue":                 "QueueName",
	"Custom::OutboxSchema":            "", // names nothing: the schema is the database's
}

// scopedByParent are naming properties unique only within another resource.
var scopedByParent = map[string]bool{"AWS::Lambda::Alias": true, "AWS::Logs::MetricFilter": true}

// accountGlobal are the types whose names are unique in the whole account,
// not per region: their names need the region as well as the stack.
var accountGlobal = map[string]bool{"AWS::CloudWatch::Dashboard": true, "AWS::IAM::Role": true, "AWS::IAM::ManagedPolicy": true}

// perStack reports whether a name expression holds the stack's name (and,
// for account-global resources, the region's): a literal, or one built
// only from parameters, is the same in every stack.
func perStack(name any, global bool) bool {
	var text strings.Builder
	var visit func(v any)
	visit = func(v any) {
		switch v := v.(type) {
		case string:
			text.WriteString(v + " ")
		case []any:
			for _, x := range v {
				visit(x)
			}
		case map[string]any:
			for k, x := range v {
				if k == "Ref" {
					text.WriteString("${" + fmt.Sprint(x) + "} ")
					continue
				}
				visit(x)
			}
		}
	}
	m, ok := name.(map[string]any)
	if !ok {
		return false // a literal
	}
	_, sub := m["Fn::Sub"]
	_, join := m["Fn::Join"]
	if !sub && !join {
		return false
	}
	visit(m)
	return strings.Contains(text.String(), "${AWS::StackName}") && (!global || strings.Contains(text.String(), "${AWS::Region}"))
}

// checkNames fails every resource whose physical name two stacks of the
// template would share: deploying the second would fail, or worse, take
// over the first's resource.
func checkNames(t *testing.T, label string, resources map[string]any) (checked int) {
	t.Helper()
	for id, raw := range resources {
		r, _ := raw.(map[string]any)
		typ, _ := r["Type"].(string)
		props, _ := r["Properties"].(map[string]any)
		prop, known := namingProperty[typ]
		switch {
		case !known:
			t.Errorf("%s: %s is a %s, whose naming property this test does not know: add it to namingProperty", label, id, typ)
		case prop != "" && props[prop] != nil && !scopedByParent[typ]:
			checked++
			if !perStack(props[prop], accountGlobal[typ]) {
				t.Errorf("%s: %s.%s = %v is the same in every stack: omit it, or build it with !Sub from ${AWS::StackName}%s",
					label, id, prop, props[prop], map[bool]string{true: " and ${AWS::Region} (the type is global to the account)"}[accountGlobal[typ]])
			}
		}
		if typ != "AWS::Serverless::Function" {
			continue
		}
		events, _ := props["Events"].(map[string]any)
		for ev, raw := range events {
			e, _ := raw.(map[string]any)
			ep, _ := e["Properties"].(map[string]any)
			if e["Type"] != "ScheduleV2" && e["Type"] != "Schedule" {
				continue
			}
			checked++
			switch name, hasName := ep["Name"]; {
			case hasName && !perStack(name, false):
				t.Errorf("%s: %s's %s schedule is named %v in every stack", label, id, ev, name)
			case !hasName && e["Type"] == "ScheduleV2" && fmt.Sprint(ep["OmitName"]) != "true":
				t.Errorf("%s: SAM names %s's %s schedule %q in every stack: set OmitName: true or a Name from ${AWS::StackName}", label, id, ev, id+ev)
			}
		}
	}
	return checked
}

// Two stacks of this template in one account and region (a staging and a
// production outbox, or two teams') must not collide on any resource name.
func TestResourceNamesCannotCollideAcrossStacks(t *testing.T) {
	t.Parallel()
	tpl := generic(load(t).Node).(map[string]any)
	resources := tpl["Resources"].(map[string]any)
	if n := checkNames(t, "template.yaml", resources); n < 5 {
		t.Errorf("only %d names checked: the dashboard, the four log groups and three schedules have names", n)
	}
}

// The same, on what CloudFormation deploys: the template as the SAM
// translator expands it (schedules, roles, invoke configs). It needs
// python3 with samtranslator (cfn-lint brings it).
func TestTranslatedResourceNamesCannotCollideAcrossStacks(t *testing.T) {
	t.Parallel()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not on the PATH: the translated template was not checked")
	}
	// cfn-lint translates the same way: a fake S3 CodeUri, no parameter
	// values, no managed-policy lookup.
	const translate = `
import json, os, sys
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
try:
    from samtranslator.translator.translator import Translator
    from samtranslator.parser import parser
    from samtranslator.yaml_helper import yaml_parse
except ImportError:
    sys.exit(3)
with open(sys.argv[1]) as f:
    tpl = yaml_parse(f.read())
tpl.setdefault("Globals", {}).setdefault("Function", {})["CodeUri"] = "s3://bucket/code.zip"
print(json.dumps(Translator(managed_policy_map={}, sam_parser=parser.Parser()).translate(tpl, parameter_values={})))
`
	cmd := exec.Command(python, "-c", translate, "../template.yaml")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if exit, ok := err.(*exec.ExitError); ok && exit.ExitCode() == 3 {
		t.Skip("python3 has no samtranslator (pip install cfn-lint): the translated template was not checked")
	}
	if err != nil {
		t.Fatalf("the SAM translator refused template.yaml: %v\n%s", err, stderr.String())
	}
	var translated struct {
		Resources map[string]any
	}
	if err := json.Unmarshal(out, &translated); err != nil {
		t.Fatal(err)
	}
	var schedules int
	for _, r := range translated.Resources {
		if r.(map[string]any)["Type"] == "AWS::Scheduler::Schedule" {
			schedules++
		}
	}
	if schedules != 3 {
		t.Errorf("%d schedules in the translated template, want 3", schedules)
	}
	checkNames(t, "translated template.yaml", translated.Resources)
}

// CloudWatch's retention values (PutRetentionPolicy).
var logRetentionDays = []string{"1", "3", "5", "7", "14", "30", "60", "90", "120", "150", "180", "365", "400", "545", "731", "1096", "1827", "2192", "2557", "2922", "3288", "3653"}

// Each function logs to a log group of its own whose retention is the
// LogRetentionDays parameter: Lambda's implicit groups keep logs forever.
func TestLogGroupsKeepLogsForLogRetentionDays(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	param := tpl.get("Parameters", "LogRetentionDays")
	if got := scalars(param.get("AllowedValues")); !slices.Equal(got, logRetentionDays) {
		t.Errorf("LogRetentionDays allows %v, want CloudWatch's values %v", got, logRetentionDays)
	}
	if !slices.Contains(logRetentionDays, param.get("Default").str()) {
		t.Errorf("LogRetentionDays default %q is not a CloudWatch value", param.get("Default").str())
	}
	groups := map[string]string{}
	for name := range functions {
		ref := tpl.get("Resources", name, "Properties", "LoggingConfig", "LogGroup")
		if ref.tag() != "!Ref" {
			t.Errorf("%s: LoggingConfig.LogGroup must be !Ref of its log group", name)
			continue
		}
		if other, dup := groups[ref.str()]; dup {
			t.Errorf("%s and %s share the log group %s", name, other, ref.str())
		}
		groups[ref.str()] = name
		g := tpl.get("Resources", ref.str())
		if g.get("Type").str() != "AWS::Logs::LogGroup" {
			t.Errorf("%s: LoggingConfig.LogGroup %s is not an AWS::Logs::LogGroup of the template", name, ref.str())
			continue
		}
		if r := g.get("Properties", "RetentionInDays"); r.tag() != "!Ref" || r.str() != "LogRetentionDays" {
			t.Errorf("%s: RetentionInDays must be !Ref LogRetentionDays", ref.str())
		}
	}
	if tpl.get("Globals", "Function", "LoggingConfig", "LogGroup").Node != nil {
		t.Error("a LogGroup in Globals would put every function in one group")
	}
}

// With a customer managed key on a topic, a secret or the database secret,
// the functions may use exactly the listed keys, and only when some are
// listed; the rest of the rules of TestPoliciesHaveNoWildcards hold.
func TestKmsKeysAreGrantedOnlyWhenListed(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	if tpl.get("Parameters", "KmsKeyArns", "Type").str() != "CommaDelimitedList" || tpl.get("Parameters", "KmsKeyArns", "Default").Node == nil {
		t.Fatal("KmsKeyArns must be a CommaDelimitedList that may be left empty")
	}
	re := regexp.MustCompile(tpl.get("Parameters", "KmsKeyArns", "AllowedPattern").str())
	if re.MatchString("arn:aws:kms:eu-west-1:123456789012:alias/outbox") {
		t.Error("KmsKeyArns accepts an alias ARN: IAM grants on aliases do not reach the key")
	}
	wantActions := map[string][]string{
		"DispatchFunction":  {"kms:GenerateDataKey", "kms:Decrypt"}, // SNS publish to an SSE-KMS topic; GetSecretValue
		"ReaperFunction":    {"kms:Decrypt"},                        // the database secret
		"DlqReplayFunction": {"kms:Decrypt"},
		"MetricsFunction":   {"kms:Decrypt"},
	}
	for name, actions := range wantActions {
		var found bool
		for _, policy := range tpl.get("Resources", name, "Properties", "Policies").Content {
			text := strings.Join(scalars(node{policy}), " ")
			if policy.Tag != "!If" || !strings.Contains(text, "kms:") {
				continue
			}
			found = true
			cond := policy.Content[0].Value
			if cond != "HasKmsKeys" && cond != "HasKmsKeysAndSecret" {
				t.Errorf("%s: the KMS statement is under condition %s, want one that is false while KmsKeyArns is empty", name, cond)
			}
			stmt := node{node{policy.Content[1]}.get("Statement").Content[0]}
			if got := scalars(stmt.get("Action")); !slices.Equal(got, actions) {
				t.Errorf("%s: KMS actions %v, want %v", name, got, actions)
			}
			if res := stmt.get("Resource"); res.tag() != "!Ref" || res.str() != "KmsKeyArns" {
				t.Errorf("%s: the KMS statement must name !Ref KmsKeyArns", name)
			}
		}
		if !found {
			t.Errorf("%s: no conditional KMS statement", name)
		}
	}
	for cond, want := range map[string]string{"HasKmsKeys": "KmsKeyArns", "HasKmsKeysAndSecret": "HasKmsKeys UseSecret"} {
		if got := strings.Join(scalars(tpl.get("Conditions", cond)), " "); !strings.Contains(got, want) {
			t.Errorf("condition %s = %q, want it built from %s", cond, got, want)
		}
	}
}

// The namespace the functions write their metrics to is the one the
// alarms and the dashboard read: one parameter.
func TestMetricsNamespaceIsOneParameter(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	if env := tpl.get("Globals", "Function", "Environment", "Variables", "OUTBOX_METRICS_NAMESPACE"); env.tag() != "!Ref" || env.str() != "MetricsNamespace" {
		t.Error("OUTBOX_METRICS_NAMESPACE must be !Ref MetricsNamespace")
	}
	param := tpl.get("Parameters", "MetricsNamespace")
	re := regexp.MustCompile(param.get("AllowedPattern").str())
	for ns, ok := range map[string]bool{param.get("Default").str(): true, "Acme/Outbox-prod": true, "": false, strings.Repeat("x", 256): false, " Outbox": false, "Outbox\"}": false} {
		if re.MatchString(ns) != ok {
			t.Errorf("MetricsNamespace pattern: %q accepted = %v, want %v", ns, !ok, ok)
		}
	}
	var watched int
	for _, name := range tpl.get("Resources").keys() {
		r := tpl.get("Resources", name)
		if r.get("Type").str() != "AWS::CloudWatch::Alarm" {
			continue
		}
		walk(r.Node, "", func(key string, n *yaml.Node) {
			if key != "Namespace" || n.Value == "AWS/Lambda" {
				return
			}
			watched++
			if n.Tag != "!Ref" || n.Value != "MetricsNamespace" {
				t.Errorf("%s: Namespace %q, want !Ref MetricsNamespace", name, n.Value)
			}
		})
	}
	if watched < 6 {
		t.Errorf("only %d alarm namespaces seen", watched)
	}
	body := tpl.get("Resources", "Dashboard", "Properties", "DashboardBody")
	text := strings.Join(scalars(body), "\n")
	if strings.Contains(text, `"Outbox"`) || !strings.Contains(text, `["${Namespace}", `) {
		t.Error(`the dashboard's metrics must read the namespace ${Namespace}, not "Outbox"`)
	}
	if v := body.Content[1].Content; len(v) < 2 || v[0].Value != "Namespace" || v[1].Tag != "!Ref" || v[1].Value != "MetricsNamespace" {
		t.Error("the dashboard's Sub must map Namespace to !Ref MetricsNamespace, first")
	}
}

// Every level the LogLevel parameter allows leaves the metrics in the logs:
// the template sets it as Lambda's ApplicationLogLevel with JSON logs, and
// Lambda drops JSON lines below it.
func TestMetricsPassEveryLogLevel(t *testing.T) {
	// Not parallel: the emf package reads AWS_LAMBDA_LOG_LEVEL, as on Lambda.
	tpl := load(t)
	logging := tpl.get("Globals", "Function", "LoggingConfig")
	if logging.get("LogFormat").str() != "JSON" || logging.get("ApplicationLogLevel").str() != "LogLevel" {
		t.Fatal("the functions log JSON at ApplicationLogLevel !Ref LogLevel")
	}
	levels := scalars(tpl.get("Parameters", "LogLevel", "AllowedValues"))
	if !slices.Contains(levels, "ERROR") {
		t.Fatalf("LogLevel allows %v", levels)
	}
	for _, level := range levels {
		t.Setenv("AWS_LAMBDA_LOG_LEVEL", level)
		m, err := emf.New(tpl.get("Parameters", "MetricsNamespace", "Default").str(), emf.Dimension{Name: "FunctionName", Value: "outbox-metrics"})
		if err != nil {
			t.Fatalf("the default MetricsNamespace: %v", err)
		}
		if err := m.Put("OldestPendingAgeSeconds", 12, emf.Seconds); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := m.Flush(&out); err != nil {
			t.Fatal(err)
		}
		emftest.Parse(t, out.Bytes())
		if !emftest.LambdaKeeps(bytes.TrimSuffix(out.Bytes(), []byte("\n")), level) {
			t.Errorf("LogLevel %s: Lambda drops the metrics document %s", level, out.Bytes())
		}
	}
}

// AWS CLI v2 reads --payload as base64 unless told otherwise: every invoke
// command the template prints passes --cli-binary-format raw-in-base64-out
// and a payload file that exists.
func TestInvokeCommandsWorkWithCLIv2(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	payload := regexp.MustCompile(`--payload file://(\S+)`)
	var commands int
	for _, name := range tpl.get("Outputs").keys() {
		for _, text := range scalars(tpl.get("Outputs", name)) {
			if !strings.Contains(text, "aws lambda invoke") {
				continue
			}
			commands++
			if !strings.Contains(text, "--cli-binary-format raw-in-base64-out") {
				t.Errorf("output %s: %q fails under AWS CLI v2 without --cli-binary-format raw-in-base64-out", name, text)
			}
			m := payload.FindStringSubmatch(text)
			if m == nil {
				t.Errorf("output %s: %q has no --payload file://", name, text)
			} else if _, err := os.Stat("../" + m[1]); err != nil {
				t.Errorf("output %s: payload %v", name, err)
			}
		}
	}
	if commands < 2 {
		t.Errorf("%d invoke commands in the outputs, want the description and the command of the replay function", commands)
	}
	if v := tpl.get("Outputs", "DlqReplayDryRunCommand", "Value"); v.tag() != "!Sub" || !strings.Contains(v.str(), "${DlqReplayFunction}") {
		t.Error("DlqReplayDryRunCommand must name the deployed function")
	}
}

// `sam deploy` run from the repository's root reads samconfig.toml next to
// template.yaml: the committed one deploys with the capabilities the
// template needs and overrides only parameters that exist.
func TestSamconfigDeploysTheTemplate(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../samconfig.toml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for _, want := range []string{"version = 0.1", "[default.deploy.parameters]", "CAPABILITY_IAM", "resolve_s3 = true"} {
		if !strings.Contains(text, want) {
			t.Errorf("samconfig.toml has no %q", want)
		}
	}
	if strings.Contains(text, "template_file") && !strings.Contains(text, `template_file = "template.yaml"`) {
		t.Error("samconfig.toml points at another template")
	}
	tpl := load(t)
	override := regexp.MustCompile(`(?m)^[#\s]*parameter_overrides\s*=\s*(.*)$`)
	params := regexp.MustCompile(`(?:^|[\s"])([A-Z][A-Za-z0-9]+)=`)
	var overridden int
	for _, m := range override.FindAllStringSubmatch(text, -1) {
		for _, p := range params.FindAllStringSubmatch(m[1], -1) {
			overridden++
			if tpl.get("Parameters", p[1]).Node == nil {
				t.Errorf("samconfig.toml overrides %s, which template.yaml does not declare", p[1])
			}
		}
	}
	if strings.Contains(text, "parameter_overrides") && overridden == 0 {
		t.Error("samconfig.toml's parameter_overrides were not read: the pattern no longer matches")
	}
}

// docs/DEPLOYING.md names every parameter of the template: the deployer
// reads what to give there.
func TestDeployingDocumentsEveryParameter(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docs/DEPLOYING.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	for _, p := range load(t).get("Parameters").keys() {
		if !strings.Contains(doc, "`"+p+"`") {
			t.Errorf("docs/DEPLOYING.md does not mention the parameter `%s`", p)
		}
	}
}

// The dispatch function's reserved concurrency is DispatchMaxWorkers, which
// also sets OUTBOX_MAX_WORKERS: Lambda itself bounds fan-out, and with it
// the database connections, whoever invokes the function. Its name is fixed
// per stack so that its own policy can name it (a !GetAtt of the function
// in its role's policy would be a circular reference), and the self-invoke
// grant names that ARN and no other.
func TestFanOutIsBoundedByReservedConcurrencyAndScopedToItself(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	props := tpl.get("Resources", "DispatchFunction", "Properties")
	if rc := props.get("ReservedConcurrentExecutions"); rc.tag() != "!Ref" || rc.str() != "DispatchMaxWorkers" {
		t.Errorf("ReservedConcurrentExecutions is %s %q, want !Ref DispatchMaxWorkers", rc.tag(), rc.str())
	}
	vars := props.get("Environment", "Variables")
	for name, param := range map[string]string{
		"OUTBOX_MAX_WORKERS": "DispatchMaxWorkers", "OUTBOX_LINGER": "DispatchLinger",
		"OUTBOX_POLL_INTERVAL": "DispatchPollInterval",
	} {
		if v := vars.get(name); v.tag() != "!Ref" || v.str() != param {
			t.Errorf("%s is %s %q, want !Ref %s", name, v.tag(), v.str(), param)
		}
	}
	// DispatchListen, but off behind a transaction pooler.
	if v := vars.get("OUTBOX_LISTEN"); v.tag() != "!If" || strings.Join(scalars(v), " ") != "BehindTransactionPooler off DispatchListen" {
		t.Errorf("OUTBOX_LISTEN is %s %v, want !If [BehindTransactionPooler, off, !Ref DispatchListen]", v.tag(), scalars(v))
	}
	const self = "arn:${AWS::Partition}:lambda:${AWS::Region}:${AWS::AccountId}:function:${AWS::StackName}-dispatch"
	if name := props.get("FunctionName"); name.tag() != "!Sub" || name.str() != "${AWS::StackName}-dispatch" {
		t.Errorf("FunctionName is %s %q, want !Sub ${AWS::StackName}-dispatch", name.tag(), name.str())
	}
	var selfInvoke int
	walk(props.get("Policies").Node, "Policies", func(_ string, n *yaml.Node) {
		if n.Kind != yaml.MappingNode {
			return
		}
		m := node{n}
		if m.get("Sid").str() != "FanOutToItself" {
			return
		}
		selfInvoke++
		if a := m.get("Action").str(); a != "lambda:InvokeFunction" {
			t.Errorf("FanOutToItself allows %q, want lambda:InvokeFunction only", a)
		}
		if r := m.get("Resource"); r.tag() != "!Sub" || r.str() != self {
			t.Errorf("FanOutToItself names %s %q, want the function's own ARN %s", r.tag(), r.str(), self)
		}
	})
	if selfInvoke != 1 {
		t.Errorf("%d FanOutToItself statements, want 1", selfInvoke)
	}
	// Defaults that overlap: each tick's invocation lingers past the next
	// tick, so one is always listening.
	params := tpl.get("Parameters")
	if params.get("DispatchLinger", "Default").str() != "on" || params.get("DispatchListen", "Default").str() != "on" {
		t.Error("linger and listen are not on by default")
	}
	if timeout, schedule := params.get("DispatchTimeout", "Default").str(), params.get("DispatchSchedule", "Default").str(); timeout != "75" || schedule != "rate(1 minute)" {
		t.Errorf("DispatchTimeout %s s with %s: the defaults no longer overlap as docs/DEPLOYING.md says", timeout, schedule)
	}
	if min := params.get("DispatchMaxWorkers", "MinValue").str(); min != "2" {
		t.Errorf("DispatchMaxWorkers MinValue %s, want 2: a lingering invocation and the next tick's run at once", min)
	}
}

// One parameter puts every function behind a transaction pooler, and what
// it implies follows from it: the simple protocol, polling instead of
// LISTEN. The migrate function never goes through one (the migrations hold
// a session lock) and may be pointed at the database itself.
func TestDatabasePoolerReachesEveryFunction(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	param := tpl.get("Parameters", "DatabasePooler")
	if param.get("Default").str() != "none" || strings.Join(scalars(param.get("AllowedValues")), " ") != "none transaction" {
		t.Errorf("DatabasePooler: default %q, allowed %v; want none, and none or transaction", param.get("Default").str(), scalars(param.get("AllowedValues")))
	}
	if c := tpl.get("Conditions", "BehindTransactionPooler"); strings.Join(scalars(c), " ") != "DatabasePooler transaction" {
		t.Errorf("BehindTransactionPooler is %v, want DatabasePooler = transaction", scalars(c))
	}
	globals := tpl.get("Globals", "Function", "Environment", "Variables")
	if v := globals.get("OUTBOX_DB_POOLER"); v.tag() != "!Ref" || v.str() != "DatabasePooler" {
		t.Errorf("Globals' OUTBOX_DB_POOLER is %s %q, want !Ref DatabasePooler", v.tag(), v.str())
	}
	if v := globals.get("OUTBOX_DB_SIMPLE_PROTOCOL"); v.tag() != "!If" || strings.Join(scalars(v), " ") != "BehindTransactionPooler true DatabaseSimpleProtocol" {
		t.Errorf("Globals' OUTBOX_DB_SIMPLE_PROTOCOL is %s %v, want !If [BehindTransactionPooler, true, !Ref DatabaseSimpleProtocol]", v.tag(), scalars(v))
	}
	for logical := range functions {
		if v := tpl.get("Resources", logical, "Properties", "Environment", "Variables", "OUTBOX_DB_POOLER"); logical != "MigrateFunction" && v.Node != nil {
			t.Errorf("%s overrides OUTBOX_DB_POOLER", logical)
		}
	}
	migrate := tpl.get("Resources", "MigrateFunction", "Properties", "Environment", "Variables")
	if v := migrate.get("OUTBOX_DB_POOLER"); v.str() != "none" {
		t.Errorf("MigrateFunction's OUTBOX_DB_POOLER is %q, want none", v.str())
	}
	for variable, want := range map[string]string{
		"OUTBOX_DB_HOST": "HasMigrationHost MigrationDatabaseHost DatabaseHost",
		"OUTBOX_DB_PORT": "HasMigrationPort MigrationDatabasePort DatabasePort",
	} {
		if v := migrate.get(variable); v.tag() != "!If" || strings.Join(scalars(v), " ") != want {
			t.Errorf("MigrateFunction's %s is %s %v, want !If [%s]", variable, v.tag(), scalars(v), want)
		}
	}
}

// Two stacks on one database split it by namespace: Namespaces reaches
// the dispatch function's OUTBOX_NAMESPACES (unset when empty), and takes
// only what the function would accept.
func TestNamespacesParameterSplitsTheDatabase(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	param := tpl.get("Parameters", "Namespaces")
	if param.get("Default").str() != "" {
		t.Errorf("Namespaces defaults to %q, want empty (every namespace)", param.get("Default").str())
	}
	v := tpl.get("Resources", "DispatchFunction", "Properties", "Environment", "Variables", "OUTBOX_NAMESPACES")
	if v.tag() != "!If" || strings.Join(scalars(v), " ") != "HasNamespaces Namespaces AWS::NoValue" {
		t.Errorf("OUTBOX_NAMESPACES is %s %v, want !If [HasNamespaces, !Ref Namespaces, !Ref AWS::NoValue]", v.tag(), scalars(v))
	}
	pattern, err := regexp.Compile(param.get("AllowedPattern").str())
	if err != nil {
		t.Fatal(err)
	}
	for value, ok := range map[string]bool{
		"": true, "billing": true, "billing,shipping": true, "mini-chat:eu/1,a.b_c": true,
		"billing, shipping": false, "*": false, "-x": false, "billing,": false, ",billing": false, strings.Repeat("n", 129): false,
	} {
		if pattern.MatchString(value) != ok {
			t.Errorf("Namespaces %q: accepted %t, want %t", value, !ok, ok)
		}
	}
}
