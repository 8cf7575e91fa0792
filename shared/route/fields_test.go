package route

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// structPaths lists the field paths of a decoding struct, the way Fields
// writes them, with each field's Go type and target tag.
func structPaths(t reflect.Type, prefix string, out map[string]structField) {
	for _, f := range structFields(t) {
		path := f.name
		if prefix != "" {
			path = prefix + "." + f.name
		}
		out[path] = f
		typ := f.typ
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		switch {
		case typ.Kind() == reflect.Struct:
			structPaths(typ, path, out)
		case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.Struct:
			structPaths(typ.Elem(), path+"[]", out)
		}
	}
}

// goKinds are the Go kinds each documented type decodes into.
var goKinds = map[string]reflect.Kind{
	"string": reflect.String, "duration": reflect.String, "integer": reflect.Int, "boolean": reflect.Bool,
	"object": reflect.Struct, "list": reflect.Slice, "map of string": reflect.Map, "JSON Schema": reflect.Slice,
}

func TestFieldsMatchTheDecodingStructs(t *testing.T) {
	t.Parallel()
	fromStructs := map[string]structField{}
	structPaths(reflect.TypeFor[fileConfig](), "", fromStructs)
	documented := map[string]bool{}
	for _, f := range Fields {
		if documented[f.Path] {
			t.Errorf("%s is documented twice", f.Path)
		}
		documented[f.Path] = true
		sf, ok := fromStructs[f.Path]
		if !ok {
			t.Errorf("%s is documented but not decoded", f.Path)
			continue
		}
		typ := sf.typ
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		if want, ok := goKinds[f.Type]; !ok || typ.Kind() != want {
			t.Errorf("%s is documented as %q but decodes into %s", f.Path, f.Type, sf.typ)
		}
		if (f.Type == "JSON Schema") != (typ == rawMessageType) {
			t.Errorf("%s: only the schema is a JSON Schema", f.Path)
		}
		if f.Target != sf.target {
			t.Errorf("%s is documented for target %q but belongs to %q", f.Path, f.Target, sf.target)
		}
		if f.Doc == "" {
			t.Errorf("%s has no Doc", f.Path)
		}
	}
	for path := range fromStructs {
		if !documented[path] {
			t.Errorf("%s is decoded but not documented in Fields", path)
		}
	}
}

// fullRoutes set every field of each target type, validly.
var fullRoutes = map[string]string{
	TypeSNS: `{"name": "n", "match": {"namespace": "a", "topic": "b"}, "retry": {"max_attempts": 3, "base_delay": "2s", "max_delay": "1m"},
		"max_payload_bytes": 1000, "schema": {"type": "object"}, "on_dead": "park", "on_config_error": "dead",
		"target": {"type": "sns", "timeout": "3s", "concurrency": 4, "topic_arn": "arn:aws:sns:eu-west-1:123456789012:p.fifo", "message_group_id": "g"}}`,
	TypeEventBridge: `{"name": "n", "match": {"namespace": "a", "topic": "b"}, "retry": {"max_attempts": 3, "base_delay": "2s", "max_delay": "1m"},
		"max_payload_bytes": 1000, "schema": {"type": "object"}, "on_dead": "park", "on_config_error": "dead",
		"target": {"type": "eventbridge", "timeout": "3s", "concurrency": 4, "event_bus": "default", "source": "s.{namespace}", "detail_type": "d.{topic}"}}`,
	TypeHTTP: `{"name": "n", "match": {"namespace": "a", "topic": "b"}, "retry": {"max_attempts": 3, "base_delay": "2s", "max_delay": "1m"},
		"max_payload_bytes": 1000, "schema": {"type": "object"}, "on_dead": "park", "on_config_error": "dead",
		"target": {"type": "http", "timeout": "3s", "concurrency": 4, "url": "http://127.0.0.1:8080/x", "signing_secret_env": "S", "headers": {"X-A": "b"}, "allow_insecure_http": true}}`,
	TypeLambda: `{"name": "n", "match": {"namespace": "a", "topic": "b"}, "retry": {"max_attempts": 3, "base_delay": "2s", "max_delay": "1m"},
		"max_payload_bytes": 1000, "schema": {"type": "object"}, "on_dead": "park", "on_config_error": "dead",
		"target": {"type": "lambda", "timeout": "3s", "concurrency": 4, "function": "f"}}`,
}

// withoutField removes a field (a path below routes[]) from a route.
func withoutField(t *testing.T, route, path string) string {
	t.Helper()
	var obj map[string]any
	if err := json.Unmarshal([]byte(route), &obj); err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(strings.TrimPrefix(path, "routes[]."), ".")
	m := obj
	for _, p := range parts[:len(parts)-1] {
		m = m[p].(map[string]any)
	}
	delete(m, parts[len(parts)-1])
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// defaultOf reads a field's value back from a parsed route, as Fields
// writes defaults.
var defaultOf = map[string]func(r *Route) string{
	"routes[].name":                       func(r *Route) string { return strings.Replace(r.Name, "0", "<index>", 1) },
	"routes[].target.timeout":             func(r *Route) string { return formatDuration(r.Timeout) },
	"routes[].target.concurrency":         func(r *Route) string { return strconv.Itoa(r.Target.Concurrency) },
	"routes[].target.source":              func(r *Route) string { return r.Target.Source },
	"routes[].target.detail_type":         func(r *Route) string { return r.Target.DetailType },
	"routes[].target.allow_insecure_http": func(r *Route) string { return strconv.FormatBool(r.Target.AllowInsecureHTTP) },
	"routes[].retry.max_attempts":         func(r *Route) string { return strconv.Itoa(r.Retry.MaxAttempts) },
	"routes[].retry.base_delay":           func(r *Route) string { return formatDuration(r.Retry.BaseDelay) },
	"routes[].retry.max_delay":            func(r *Route) string { return formatDuration(r.Retry.MaxDelay) },
	"routes[].max_payload_bytes":          func(r *Route) string { return r.Target.Type + " " + bytesDoc(r.MaxPayloadBytes) },
	"routes[].on_dead":                    func(r *Route) string { return r.OnDead },
	"routes[].on_config_error":            func(r *Route) string { return r.OnConfigError },
}

// Removing a documented-required field fails at that field; removing any
// other leaves the route valid and takes the documented default.
func TestFieldsRequiredAndDefaultsAreTrue(t *testing.T) {
	t.Parallel()
	// Exactly one of the two is required; Rule says so.
	exactlyOne := map[string]bool{"routes[].target.signing_secret_env": true, "routes[].target.signing_secret_arn": true}
	checked := map[string]bool{}
	for _, typ := range TargetTypes {
		if _, err := Parse([]byte(config(fullRoutes[typ]))); err != nil {
			t.Fatalf("the full %s route is invalid: %v", typ, err)
		}
		for _, f := range Fields {
			if f.Path == "routes" || (f.Target != "" && f.Target != typ) || exactlyOne[f.Path] {
				continue
			}
			if f.Path == "routes[].retry.max_delay" || f.Path == "routes[].retry.base_delay" {
				// Removing one alone could break max_delay >= base_delay:
				// check each default against the other's default.
				continue
			}
			checked[f.Path] = true
			route := withoutField(t, fullRoutes[typ], f.Path)
			table, err := Parse([]byte(config(route)))
			concrete := strings.Replace(f.Path, "routes[]", "routes[0]", 1)
			if f.Required {
				ce, _ := err.(*ConfigError)
				if ce == nil || len(ce.Problems) == 0 || ce.Problems[0].Field != concrete {
					t.Errorf("%s without %s: err = %v, want a problem at %s", typ, f.Path, err, concrete)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s is documented as optional, but %s without it: %v", f.Path, typ, err)
				continue
			}
			if get := defaultOf[f.Path]; get != nil {
				if got := get(table.Routes[0]); !strings.Contains(f.Default, got) {
					t.Errorf("%s: documented default %q, but %s has %q", f.Path, f.Default, typ, got)
				}
			} else if f.Default != "" {
				t.Errorf("%s documents a default the test cannot check", f.Path)
			}
		}
	}
	// The retry delays, with the other removed too.
	route := withoutField(t, withoutField(t, fullRoutes[TypeLambda], "routes[].retry.base_delay"), "routes[].retry.max_delay")
	table, err := Parse([]byte(config(route)))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"routes[].retry.base_delay", "routes[].retry.max_delay"} {
		checked[path] = true
		if got, f := defaultOf[path](table.Routes[0]), fieldDoc(t, path); got != f.Default {
			t.Errorf("%s: documented default %q, parsed %q", path, f.Default, got)
		}
	}
	for _, f := range Fields {
		if !checked[f.Path] && f.Path != "routes" && !exactlyOne[f.Path] {
			t.Errorf("%s was not checked", f.Path)
		}
	}
}

func fieldDoc(t *testing.T, path string) FieldDoc {
	t.Helper()
	i := slices.IndexFunc(Fields, func(f FieldDoc) bool { return f.Path == path })
	if i < 0 {
		t.Fatalf("no FieldDoc for %s", path)
	}
	return Fields[i]
}

// referenceLine is a field's line in the reference table of doc.go.
func referenceLine(f FieldDoc) string {
	var tail []string
	switch {
	case f.Required:
		tail = append(tail, "required")
	case f.Default != "":
		tail = append(tail, "default "+f.Default)
	}
	if f.Target != "" {
		tail = append(tail, "("+f.Target+")")
	}
	return strings.TrimRight(fmt.Sprintf("%-36s %-13s %s", f.Path, f.Type, strings.Join(tail, " ")), " ")
}

// docComment returns doc.go's package comment without the comment markers.
func docComment(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for line := range strings.SplitSeq(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "//"); ok {
			lines = append(lines, strings.TrimPrefix(rest, " "))
		}
	}
	return lines
}

// codeBlock returns the indented block that follows the line intro.
func codeBlock(t *testing.T, lines []string, intro string) string {
	t.Helper()
	i := slices.Index(lines, intro)
	if i < 0 {
		t.Fatalf("doc.go has no line %q", intro)
	}
	var block []string
	for _, line := range lines[i+2:] { // skip the blank line after intro
		text, ok := strings.CutPrefix(line, "\t")
		if !ok {
			break
		}
		block = append(block, text)
	}
	return strings.Join(block, "\n")
}

func TestDocReferenceMatchesFields(t *testing.T) {
	t.Parallel()
	var want []string
	for _, f := range Fields {
		want = append(want, referenceLine(f))
	}
	got := codeBlock(t, docComment(t), "(Fields holds the same table, with the rules, for tools):")
	if got != strings.Join(want, "\n") {
		t.Errorf("the reference table in doc.go is out of date; it should read:\n\n%s", "//\t"+strings.Join(want, "\n//\t"))
	}
}

func TestDocExamplesParse(t *testing.T) {
	t.Parallel()
	lines := docComment(t)
	fromJSON, err := Parse([]byte(codeBlock(t, lines, "The example in JSON:")))
	if err != nil {
		t.Fatalf("the JSON example: %v", err)
	}
	fromYAML, err := Parse([]byte(codeBlock(t, lines, "The same in YAML:")))
	if err != nil {
		t.Fatalf("the YAML example: %v", err)
	}
	if a, b := describeTable(fromJSON), describeTable(fromYAML); a != b {
		t.Errorf("the examples differ:\nJSON: %s\nYAML: %s", a, b)
	}
	if len(fromJSON.Routes) != 4 {
		t.Errorf("the example has %d routes, want one per target type", len(fromJSON.Routes))
	}
}

func TestREADMEReferenceMatchesFields(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- routes:begin -->\n", "<!-- routes:end -->"
	i, j := strings.Index(string(raw), begin), strings.Index(string(raw), end)
	if i < 0 || j < i {
		t.Fatal("README.md has no routes reference block")
	}
	if got, want := string(raw)[i+len(begin):j], MarkdownReference(); got != want {
		t.Errorf("README.md's routes reference is out of date; between the routes markers it should read:\n\n%s", want)
	}
}
