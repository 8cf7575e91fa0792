// Package emftest validates CloudWatch Embedded Metric Format documents
// against the specification (CloudWatch_Embedded_Metric_Format_Specification,
// including its JSON schema), independently of the emf package's own code:
// the emf tests and the functions' end-to-end tests run everything written
// through it.
package emftest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Document is one parsed, validated EMF document.
type Document struct {
	Timestamp  int64
	Namespace  string
	Sets       [][]string
	Metrics    map[string]MetricValues // by name
	Order      []string                // metric names in definition order
	Dimensions map[string]string       // referenced dimensions and their values
	Properties map[string]any          // every other top-level member
}

type MetricValues struct {
	Unit   string
	Values []float64
}

// units is the schema's pattern for MetricDefinition.Unit.
var units = map[string]bool{
	"Seconds": true, "Microseconds": true, "Milliseconds": true,
	"Bytes": true, "Kilobytes": true, "Megabytes": true, "Gigabytes": true, "Terabytes": true,
	"Bits": true, "Kilobits": true, "Megabits": true, "Gigabits": true, "Terabits": true,
	"Percent": true, "Count": true,
	"Bytes/Second": true, "Kilobytes/Second": true, "Megabytes/Second": true, "Gigabytes/Second": true, "Terabytes/Second": true,
	"Bits/Second": true, "Kilobits/Second": true, "Megabits/Second": true, "Gigabits/Second": true, "Terabits/Second": true,
	"Count/Second": true, "None": true,
}

// checkDocument validates one log line against the specification and
// returns what it found and every violation.
func Check(line []byte) (Document, []string) {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	doc := Document{Metrics: map[string]MetricValues{}, Dimensions: map[string]string{}, Properties: map[string]any{}}

	// The LogEvent message MUST be a JSON object with no additional data
	// before or after it.
	var root map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&root); err != nil {
		fail("not a JSON object: %v", err)
		return doc, problems
	}
	if dec.More() {
		fail("data after the JSON object")
	}
	if root == nil {
		fail("root is not an object")
		return doc, problems
	}

	// _aws: an object with Timestamp (integer, ms) and CloudWatchMetrics.
	var aws map[string]json.RawMessage
	if err := json.Unmarshal(root["_aws"], &aws); err != nil || aws == nil {
		fail("_aws missing or not an object")
		return doc, problems
	}
	for k := range aws {
		if k != "Timestamp" && k != "CloudWatchMetrics" {
			fail("_aws has the unexpected member %q", k)
		}
	}
	var ts json.Number
	if err := strictNumber(aws["Timestamp"], &ts); err != nil {
		fail("_aws.Timestamp: %v", err)
	} else if n, err := ts.Int64(); err != nil {
		fail("_aws.Timestamp %s is not an integer", ts)
	} else if n < 1e12 {
		fail("_aws.Timestamp %d is not in milliseconds", n)
	} else {
		doc.Timestamp = n
	}

	var directives []map[string]json.RawMessage
	if err := json.Unmarshal(aws["CloudWatchMetrics"], &directives); err != nil || directives == nil {
		fail("_aws.CloudWatchMetrics missing or not an array of objects")
		return doc, problems
	}
	if len(directives) != 1 {
		fail("%d metric directives, want 1", len(directives))
	}
	referencedDims := map[string]bool{}
	for i, dir := range directives {
		for k := range dir {
			if k != "Namespace" && k != "Dimensions" && k != "Metrics" {
				fail("directive %d has the unexpected member %q", i, k)
			}
		}
		var ns string
		if err := json.Unmarshal(dir["Namespace"], &ns); err != nil || ns == "" || len(ns) > 255 {
			fail("directive %d: Namespace %s must be a string of 1-255 characters", i, dir["Namespace"])
		}
		doc.Namespace = ns

		var sets [][]string
		if err := json.Unmarshal(dir["Dimensions"], &sets); err != nil || sets == nil {
			fail("directive %d: Dimensions must be an array of arrays of strings", i)
		}
		if len(sets) < 1 {
			fail("directive %d: Dimensions must hold at least one dimension set", i)
		}
		for _, set := range sets {
			if set == nil {
				fail("directive %d: a dimension set is null", i)
			}
			if len(set) > 30 {
				fail("directive %d: dimension set of %d keys (at most 30)", i, len(set))
			}
			for _, key := range set {
				if key == "" || len(key) > 255 {
					fail("directive %d: dimension reference %q must be 1-255 characters", i, key)
				}
				referencedDims[key] = true
			}
		}
		doc.Sets = sets

		var defs []map[string]json.RawMessage
		if err := json.Unmarshal(dir["Metrics"], &defs); err != nil || defs == nil {
			fail("directive %d: Metrics must be an array of objects", i)
		}
		if len(defs) > 100 {
			fail("directive %d: %d metric definitions (at most 100)", i, len(defs))
		}
		if len(defs) == 0 {
			fail("directive %d: no metric definitions", i)
		}
		for _, def := range defs {
			for k := range def {
				if k != "Name" && k != "Unit" && k != "StorageResolution" {
					fail("metric definition has the unexpected member %q", k)
				}
			}
			var name, unit string
			if err := json.Unmarshal(def["Name"], &name); err != nil || name == "" || len(name) > 255 {
				fail("metric definition Name %s must be a string of 1-255 characters", def["Name"])
				continue
			}
			if raw, ok := def["Unit"]; ok {
				if err := json.Unmarshal(raw, &unit); err != nil || !units[unit] {
					fail("metric %q: Unit %s is not a CloudWatch unit", name, raw)
				}
			} else {
				unit = "None"
			}
			if _, dup := doc.Metrics[name]; dup {
				fail("metric %q defined twice", name)
			}
			values, err := metricTarget(root[name])
			if err != nil {
				fail("metric %q: target member: %v", name, err)
			}
			doc.Metrics[name] = MetricValues{Unit: unit, Values: values}
			doc.Order = append(doc.Order, name)
		}
	}
	// Every referenced dimension MUST be a top-level member with a string
	// value.
	for key := range referencedDims {
		raw, ok := root[key]
		if !ok {
			fail("dimension %q is referenced but not a top-level member", key)
			continue
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			fail("dimension %q has the non-string value %s", key, raw)
		}
		doc.Dimensions[key] = v
	}
	for k, raw := range root {
		if k == "_aws" || referencedDims[k] {
			continue
		}
		if _, isMetric := doc.Metrics[k]; isMetric {
			continue
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			fail("member %q is not valid JSON", k)
		}
		doc.Properties[k] = v
	}
	return doc, problems
}

// metricTarget decodes a metric's target member: a number or an array of 1
// to 100 numbers.
func metricTarget(raw json.RawMessage) ([]float64, error) {
	if raw == nil {
		return nil, fmt.Errorf("missing")
	}
	var one float64
	if err := json.Unmarshal(raw, &one); err == nil {
		return []float64{one}, nil
	}
	var many []float64
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("%s is neither a number nor an array of numbers", raw)
	}
	if len(many) == 0 || len(many) > 100 {
		return nil, fmt.Errorf("array of %d values (1 to 100)", len(many))
	}
	return many, nil
}

func strictNumber(raw json.RawMessage, n *json.Number) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("missing or invalid")
	}
	num, ok := v.(json.Number)
	if !ok {
		return fmt.Errorf("%s is not a number", raw)
	}
	*n = num
	return nil
}

// parseOutput splits what Flush wrote into lines, validates each as an EMF
// document and fails the test on any violation.
func Parse(t *testing.T, out []byte) []Document {
	t.Helper()
	var docs []Document
	text := string(out)
	if text != "" && !strings.HasSuffix(text, "\n") {
		t.Fatalf("output does not end with a newline: %q", text)
	}
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if line == "" {
			if text == "" {
				break
			}
			t.Fatalf("document %d is an empty line", i)
		}
		doc, problems := Check([]byte(line))
		for _, p := range problems {
			t.Errorf("document %d violates the EMF specification: %s\n%s", i, p, line)
		}
		docs = append(docs, doc)
	}
	if t.Failed() {
		t.FailNow()
	}
	return docs
}

// The validator must catch what the specification forbids, or the tests
// that rely on it prove nothing.

// lambdaLevels ranks the levels of Lambda's log-level filtering, least
// severe first.
var lambdaLevels = map[string]int{"TRACE": 0, "DEBUG": 1, "INFO": 2, "WARN": 3, "ERROR": 4, "FATAL": 5}

// LambdaKeeps reports whether Lambda's log-level filtering, with the JSON
// log format and the function's application log level set to
// applicationLevel ("" for no filtering), sends line to CloudWatch Logs. It
// follows the rules of the Lambda Developer Guide ("Log-level filtering")
// for runtimes whose logs Lambda does not format itself: the level is read
// from a JSON object's "level" member, in any case; a missing or unknown
// level counts as INFO, and so does a line without a valid RFC 3339
// "timestamp"; lines below the application level are dropped.
func LambdaKeeps(line []byte, applicationLevel string) bool {
	threshold, ok := lambdaLevels[strings.ToUpper(applicationLevel)]
	if !ok {
		return true
	}
	level := lambdaLevels["INFO"]
	var record struct {
		Level     *string `json:"level"`
		Timestamp *string `json:"timestamp"`
	}
	if json.Unmarshal(line, &record) == nil && record.Level != nil && record.Timestamp != nil {
		if _, err := time.Parse(time.RFC3339Nano, *record.Timestamp); err == nil {
			if l, known := lambdaLevels[strings.ToUpper(*record.Level)]; known {
				level = l
			}
		}
	}
	return level >= threshold
}
