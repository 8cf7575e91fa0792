package infra_test

import (
	"os"
	"regexp"
	"slices"
	"testing"
)

// Every alarm of the template has a runbook heading in docs/OPERATIONS.md,
// and every runbook names an alarm the template still has: the page an
// on-call engineer opens from an alarm must exist and be the right one.
func TestEveryAlarmHasARunbook(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	var runbooks []string
	for _, m := range regexp.MustCompile(`(?m)^### ([A-Za-z0-9]+Alarm)$`).FindAllSubmatch(raw, -1) {
		runbooks = append(runbooks, string(m[1]))
	}
	res := load(t).get("Resources")
	var alarms []string
	for _, name := range res.keys() {
		if res.get(name, "Type").str() == "AWS::CloudWatch::Alarm" {
			alarms = append(alarms, name)
		}
	}
	if len(alarms) < 5 {
		t.Fatalf("found %d alarms in template.yaml: the scan is broken", len(alarms))
	}
	for _, a := range alarms {
		if !slices.Contains(runbooks, a) {
			t.Errorf("alarm %s has no runbook: add a \"### %s\" section to docs/OPERATIONS.md", a, a)
		}
	}
	for _, r := range runbooks {
		if !slices.Contains(alarms, r) {
			t.Errorf("docs/OPERATIONS.md has a runbook for %s, which template.yaml no longer defines", r)
		}
	}
}
