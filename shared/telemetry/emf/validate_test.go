package emf_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/testkit/emftest"
)

func TestValidatorRejectsInvalidDocuments(t *testing.T) {
	t.Parallel()
	valid := `{"_aws":{"Timestamp":1700000000000,"CloudWatchMetrics":[{"Namespace":"Outbox","Dimensions":[["FunctionName"]],"Metrics":[{"Name":"Claimed","Unit":"Count"}]}]},"FunctionName":"dispatch","Claimed":3}`
	if _, problems := emftest.Check([]byte(valid)); len(problems) != 0 {
		t.Fatalf("a valid document was rejected: %v", problems)
	}
	manyKeys := make([]string, 31)
	for i := range manyKeys {
		manyKeys[i] = fmt.Sprintf("%q", fmt.Sprintf("D%d", i))
	}
	manyDefs := make([]string, 101)
	for i := range manyDefs {
		manyDefs[i] = fmt.Sprintf(`{"Name":"M%d","Unit":"Count"}`, i)
	}
	invalid := map[string]string{
		"trailing data":           valid + ` x`,
		"no _aws":                 `{"Claimed":3}`,
		"timestamp in seconds":    strings.Replace(valid, "1700000000000", "1700000000", 1),
		"timestamp not integer":   strings.Replace(valid, "1700000000000", "1700000000000.5", 1),
		"no namespace":            strings.Replace(valid, `"Namespace":"Outbox",`, "", 1),
		"empty namespace":         strings.Replace(valid, `"Namespace":"Outbox"`, `"Namespace":""`, 1),
		"no dimension sets":       strings.Replace(valid, `[["FunctionName"]]`, `[]`, 1),
		"dimension not top-level": strings.Replace(valid, `"FunctionName":"dispatch",`, "", 1),
		"dimension not a string":  strings.Replace(valid, `"FunctionName":"dispatch"`, `"FunctionName":7`, 1),
		"31 dimension keys":       strings.Replace(valid, `[["FunctionName"]]`, "[["+strings.Join(manyKeys, ",")+"]]", 1),
		"metric not top-level":    strings.Replace(valid, `,"Claimed":3`, "", 1),
		"metric not a number":     strings.Replace(valid, `"Claimed":3`, `"Claimed":"3"`, 1),
		"101 values":              strings.Replace(valid, `"Claimed":3`, `"Claimed":[`+strings.TrimSuffix(strings.Repeat("1,", 101), ",")+`]`, 1),
		"bad unit":                strings.Replace(valid, `"Unit":"Count"`, `"Unit":"count"`, 1),
		"101 metrics":             strings.Replace(valid, `[{"Name":"Claimed","Unit":"Count"}]`, "["+strings.Join(manyDefs, ",")+"]", 1),
		"unknown _aws member":     strings.Replace(valid, `"Timestamp"`, `"Extra":1,"Timestamp"`, 1),
	}
	for name, doc := range invalid {
		if _, problems := emftest.Check([]byte(doc)); len(problems) == 0 {
			t.Errorf("%s: the validator accepted %s", name, doc)
		}
	}
}
