package infra_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// Routes beyond Lambda's 4 KB environment come from a file in the build
// artifact or an SSM parameter: the template sets exactly one of the three
// variables, refuses a deployment that gives none or several, and grants
// the parameter alone, only when one is named.
func TestRoutesComeFromExactlyOneSource(t *testing.T) {
	t.Parallel()
	tpl := load(t)
	variables := tpl.get("Resources", "DispatchFunction", "Properties", "Environment", "Variables")
	for variable, parameter := range map[string]string{
		"OUTBOX_ROUTES": "Routes", "OUTBOX_ROUTES_FILE": "RoutesFile", "OUTBOX_ROUTES_SSM_PARAMETER": "RoutesSsmParameter",
	} {
		v := variables.get(variable)
		// !If [Has…, !Ref Parameter, !Ref AWS::NoValue]: an unset source
		// is no variable at all, not an empty one.
		if v.tag() != "!If" || len(v.Content) != 3 || v.Content[1].Tag != "!Ref" || v.Content[1].Value != parameter ||
			v.Content[2].Value != "AWS::NoValue" {
			t.Errorf("DispatchFunction's %s is not set from %s only when %s is given", variable, parameter, parameter)
		}
		if p := tpl.get("Parameters", parameter); p.get("Default").Node == nil || p.get("Default").str() != "" {
			t.Errorf("parameter %s has no empty default: the other sources could not be used alone", parameter)
		}
		if cond := tpl.get("Conditions", v.Content[0].Value); cond.Node == nil {
			t.Errorf("%s's condition %s is not declared", variable, v.Content[0].Value)
		}
	}
	rule := tpl.get("Rules", "ExactlyOneRoutesSource", "Assertions")
	if rule.Node == nil || len(rule.Content) != 1 {
		t.Fatal("no ExactlyOneRoutesSource rule: a deployment with no routes (or two sources) would fail only at the first cold start")
	}
	// The assertion, evaluated for every combination of the three set or
	// empty, holds exactly when one is set.
	assertion := rule.Content[0]
	var assert *yaml.Node
	for i := 0; i+1 < len(assertion.Content); i += 2 {
		if assertion.Content[i].Value == "Assert" {
			assert = assertion.Content[i+1]
		}
	}
	sources := []string{"Routes", "RoutesFile", "RoutesSsmParameter"}
	for mask := range 8 {
		values := map[string]string{}
		set := 0
		for i, p := range sources {
			if mask&(1<<i) != 0 {
				values[p] = "x"
				set++
			} else {
				values[p] = ""
			}
		}
		got, err := evalCondition(assert, values)
		if err != nil {
			t.Fatalf("ExactlyOneRoutesSource: %v", err)
		}
		if got != (set == 1) {
			t.Errorf("ExactlyOneRoutesSource with %v: %v, want %v", values, got, set == 1)
		}
	}

	policy := tpl.get("Resources", "DispatchRoutesParameterPolicy")
	if policy.get("Condition").str() != "HasRoutesParameter" {
		t.Errorf("DispatchRoutesParameterPolicy is not conditional on HasRoutesParameter: granted without a parameter")
	}
	if roles := scalars(policy.get("Properties", "Roles")); len(roles) != 1 || roles[0] != "DispatchFunctionRole" {
		t.Errorf("DispatchRoutesParameterPolicy is attached to %v, want the dispatch function's role alone", roles)
	}
	statement := strings.Join(scalars(policy.get("Properties", "PolicyDocument", "Statement")), " ")
	if !strings.Contains(statement, "ssm:GetParameter ") || !strings.Contains(statement, ":parameter${RoutesSsmParameter}") {
		t.Errorf("DispatchRoutesParameterPolicy does not grant ssm:GetParameter on the parameter alone: %s", statement)
	}

	// The ARN is built by appending the name: only a name starting with /
	// makes a valid one, and a file is only in the artifact under /var/task.
	for parameter, cases := range map[string]map[string]bool{
		"RoutesSsmParameter": {"/outbox/routes": true, "/outbox-prod/dispatch.routes": true, "": true, "outbox-routes": false, "/outbox/*": false, "/": false},
		"RoutesFile":         {"/var/task/routes.json": true, "": true, "routes.json": false, "/etc/passwd": false},
	} {
		pattern := regexp.MustCompile(tpl.get("Parameters", parameter, "AllowedPattern").str())
		for value, ok := range cases {
			if pattern.MatchString(value) != ok {
				t.Errorf("%s's AllowedPattern accepts %q: %v, want %v", parameter, value, !ok, ok)
			}
		}
	}
}

// sam build runs the Makefile's build-DispatchFunction; a routes file at
// the repository's root lands next to bootstrap, where RoutesFile finds it.
func TestDispatchBuildShipsTheRoutesFile(t *testing.T) {
	t.Parallel()
	makeCmd, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make is not on the PATH: the build target was not checked")
	}
	makefile, err := filepath.Abs("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for _, files := range [][]string{{"routes.yaml"}, {"routes.json"}, nil} {
		root, artifacts := t.TempDir(), t.TempDir()
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(root, f), []byte(`{"routes":[]}`), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		// GO=true: the compile is someone else's test; this one checks what
		// the target ships beside it.
		cmd := exec.Command(makeCmd, "-s", "-f", makefile, "build-DispatchFunction", "GO=true", "ARTIFACTS_DIR="+artifacts)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make build-DispatchFunction with %v at the root: %v\n%s", files, err, out)
		}
		entries, err := os.ReadDir(artifacts)
		if err != nil {
			t.Fatal(err)
		}
		var shipped []string
		for _, e := range entries {
			shipped = append(shipped, e.Name())
		}
		if strings.Join(shipped, " ") != strings.Join(files, " ") {
			t.Errorf("with %v at the root, the artifact holds %v", files, shipped)
		}
	}
}

// evalCondition evaluates a rule's or condition's intrinsics — !Or, !And,
// !Not, !Equals, !Ref to a parameter and literals — with the parameters'
// values.
func evalCondition(n *yaml.Node, params map[string]string) (bool, error) {
	switch n.Tag {
	case "!Or", "!And":
		anyTrue, all := false, true
		for _, c := range n.Content {
			v, err := evalCondition(c, params)
			if err != nil {
				return false, err
			}
			anyTrue, all = anyTrue || v, all && v
		}
		if n.Tag == "!Or" {
			return anyTrue, nil
		}
		return all, nil
	case "!Not":
		if len(n.Content) != 1 {
			return false, fmt.Errorf("!Not takes one condition, got %d", len(n.Content))
		}
		v, err := evalCondition(n.Content[0], params)
		return !v, err
	case "!Equals":
		if len(n.Content) != 2 {
			return false, fmt.Errorf("!Equals takes two values, got %d", len(n.Content))
		}
		var vals [2]string
		for i, c := range n.Content {
			switch {
			case c.Tag == "!Ref":
				v, ok := params[c.Value]
				if !ok {
					return false, fmt.Errorf("!Ref %s: not one of the parameters evaluated", c.Value)
				}
				vals[i] = v
			case c.Kind == yaml.ScalarNode:
				vals[i] = c.Value
			default:
				return false, fmt.Errorf("!Equals of a %s", c.Tag)
			}
		}
		return vals[0] == vals[1], nil
	}
	return false, fmt.Errorf("cannot evaluate %s", n.Tag)
}
