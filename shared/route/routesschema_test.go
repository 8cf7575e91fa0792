package route

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/dispatcher/shared/outbox"
)

// fieldDoc is one field of the routes schema as the references (the
// docs/CONFIGURATION.md's table, doc.go's) present it.
type fieldDoc struct {
	// Path is the field's path: "routes[].target.topic_arn".
	Path string
	// Type is string, integer, boolean, object, list, duration, "map of
	// string" or "JSON Schema".
	Type string
	// Target lists the target types the field belongs to; empty for a
	// field of every route or target.
	Target string
	// Required says whether the field must be set (for its Target).
	Required bool
	// Default is the schema's "default".
	Default string
	// Values are the values the schema's enum, minimum and maximum allow.
	Values string
	// Doc is the schema's description.
	Doc string
}

// reference lists the fields of the routes schema in the order written.
func reference(t testing.TB) []fieldDoc {
	t.Helper()
	s := loadRoutesSchema()
	var out []fieldDoc
	var walk func(owner, prefix string)
	walk = func(owner, prefix string) {
		def := schemaNode(owner)
		props, _ := def["properties"].(map[string]any)
		for _, name := range s.order[owner] {
			node, _ := props[name].(map[string]any)
			path := prefix + "." + name
			if prefix == "" {
				path = name
			}
			ref, _ := node["$ref"].(string)
			f := fieldDoc{Path: path, Type: jsonType(node), Required: slices.Contains(stringList(def["required"]), name),
				Default: defaultText(node["default"]), Values: valuesText(node)}
			f.Doc, _ = node["description"].(string)
			if owner == "/$defs/target" {
				var owners []string
				for _, typ := range targetTypes() {
					if slices.Contains(s.order["/$defs/"+typ], name) {
						owners = append(owners, typ)
					}
				}
				if len(owners) < len(targetTypes()) {
					f.Target = strings.Join(owners, ", ")
					for _, typ := range owners {
						f.Required = f.Required || slices.Contains(stringList(schemaNode("/$defs/" + typ)["required"]), name)
					}
				}
			}
			if path == "routes[].max_payload_bytes" {
				var defaults, maxima []string
				for _, b := range payloadBranches(t) {
					defaults = append(defaults, b.targetType+" "+bytesDoc(b.fallback))
					maxima = append(maxima, b.targetType+" "+bytesDoc(b.maximum))
				}
				f.Default = strings.Join(defaults, "; ")
				f.Values = "1 to the target type's maximum: " + strings.Join(maxima, "; ")
			}
			out = append(out, f)
			switch {
			case f.Type == "object" && ref != "":
				walk(strings.TrimPrefix(ref, "#"), path)
			case f.Type == "list":
				items, _ := node["items"].(map[string]any)
				ref, _ := items["$ref"].(string)
				walk(strings.TrimPrefix(ref, "#"), path+"[]")
			}
		}
	}
	walk("", "")
	return out
}

func jsonType(node map[string]any) string {
	switch typ := node["type"].(type) {
	case nil:
		return "object" // defined apart, under $defs
	case []any:
		return "JSON Schema" // an object or a boolean
	case string:
		switch {
		case node["$ref"] == "#/$defs/duration":
			return "duration"
		case typ == "array":
			return "list"
		case typ == "object":
			return "map of string"
		}
		return typ
	}
	return "?"
}

func stringList(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

func defaultText(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

// valuesText describes what a field's enum, minimum and maximum allow.
func valuesText(node map[string]any) string {
	if enum := stringList(node["enum"]); enum != nil {
		return strings.Join(enum, ", ")
	}
	minimum, maximum := fmt.Sprint(node["minimum"]), fmt.Sprint(node["maximum"])
	for _, part := range append([]any{node}, anyList(node["allOf"])...) {
		if n, ok := part.(map[string]any)["minItems"]; ok {
			return fmt.Sprintf("at least %v", n)
		}
	}
	switch {
	case node["minimum"] != nil && node["maximum"] != nil:
		return minimum + "-" + maximum
	case node["minimum"] != nil:
		return "at least " + minimum
	}
	return ""
}

func anyList(v any) []any {
	list, _ := v.([]any)
	return list
}

func bytesDoc(n int) string {
	switch {
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d (%d MiB)", n, n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d (%d KiB)", n, n>>10)
	}
	return strconv.Itoa(n)
}

func TestEveryFieldIsDescribed(t *testing.T) {
	t.Parallel()
	for _, f := range reference(t) {
		if f.Doc == "" || f.Type == "?" {
			t.Errorf("%s has no description or no type in routes.schema.json", f.Path)
		}
	}
}

// Route names and match patterns follow the producer's rule on names: the
// schema writes the length as maxLength (a pattern's {0,127} compiles to
// 128 copies of its class), and takes exactly what outbox.NamePattern takes.
func TestSchemaNameRuleIsOutboxs(t *testing.T) {
	t.Parallel()
	rule := schemaNode("/$defs/name")
	pattern := regexp.MustCompile(rule["pattern"].(string))
	maxLength, err := strconv.Atoi(fmt.Sprint(rule["maxLength"]))
	if err != nil {
		t.Fatalf("the schema's name has no maxLength: %v", err)
	}
	for _, name := range []string{"", "a", "billing", "Billing.v2", "a:b/c.d_e-f", "0", "-a", ".a", "a b", "a*", "é", "aé",
		strings.Repeat("a", 127), strings.Repeat("a", 128), strings.Repeat("a", 129), "a" + strings.Repeat("-", 127), "a\n"} {
		schema := pattern.MatchString(name) && utf8.RuneCountInString(name) <= maxLength
		if want := outbox.NamePattern.MatchString(name); schema != want {
			t.Errorf("name %q: the schema takes it: %t, outbox.NamePattern: %t", name, schema, want)
		}
	}
}

// decodedPaths lists the field paths of a decoding struct, as reference
// writes them, with each field's Go type. The fields of an embedded struct
// (Route in routeConfig) are decoded as its own.
func decodedPaths(t reflect.Type, prefix string, out map[string]reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case !f.IsExported() || name == "-":
			continue
		case f.Anonymous:
			decodedPaths(f.Type, prefix, out)
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		out[path] = f.Type
		switch {
		case f.Type.Kind() == reflect.Struct:
			decodedPaths(f.Type, path, out)
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			decodedPaths(f.Type.Elem(), path+"[]", out)
		}
	}
}

// goKinds are the Go kinds each documented type decodes into.
var goKinds = map[string]reflect.Kind{
	"string": reflect.String, "duration": reflect.String, "integer": reflect.Float64, "boolean": reflect.Bool,
	"object": reflect.Struct, "list": reflect.Slice, "map of string": reflect.Map, "JSON Schema": reflect.Slice,
}

func TestFieldsMatchTheDecodingStructs(t *testing.T) {
	t.Parallel()
	decoded := map[string]reflect.Type{}
	decodedPaths(reflect.TypeFor[fileConfig](), "", decoded)
	documented := map[string]bool{}
	for _, f := range reference(t) {
		documented[f.Path] = true
		typ, ok := decoded[f.Path]
		if !ok {
			t.Errorf("%s is in the schema but not decoded", f.Path)
			continue
		}
		if want, ok := goKinds[f.Type]; !ok || typ.Kind() != want {
			t.Errorf("%s is a %q in the schema but decodes into %s", f.Path, f.Type, typ)
		}
		if (f.Type == "JSON Schema") != (typ == reflect.TypeFor[json.RawMessage]()) {
			t.Errorf("%s: only the payload schema is a JSON Schema", f.Path)
		}
	}
	for path := range decoded {
		if !documented[path] {
			t.Errorf("%s is decoded but not in the schema", path)
		}
	}
}

// fullRoutes set every field of each target type, validly.
var fullRoutes = map[string]string{
	TypeSNS: `{"name": "n", "match": {"namespace": "a", "topic": "b"}, "retry": {"max_attempts": 3, "base_delay": "2s", "max_delay": "1m"},
		"max_payload_bytes": 1000, "schema": {"type": "object"}, "on_dead": "park", "on_config_error": "dead", "circuit_breaker": {"failures": 5, "cool_down": "60s"}, "rate_limit": {"per_second": 100},
		"offload": {"bucket": "b-1", "threshold_bytes": 900, "prefix": "p/", "kms_key_id": "alias/k", "url_ttl": "5m"},
		"target": {"type": "sns", "timeout": "3s", "concurrency": 4, "topic_arn": "arn:aws:sns:eu-west-1:123456789012:p.fifo", "message_group_id": "g"}}`,
	TypeEventBridge: `{"name": "n", "match": {"namespace": "a", "topic": "b"}, "retry": {"max_attempts": 3, "base_delay": "2s", "max_delay": "1m"},
		"max_payload_bytes": 1000, "schema": {"type": "object"}, "on_dead": "park", "on_config_error": "dead", "circuit_breaker": {"failures": 5, "cool_down": "60s"}, "rate_limit": {"per_second": 100},
		"offload": {"bucket": "b-1", "threshold_bytes": 900, "prefix": "p/", "kms_key_id": "alias/k", "url_ttl": "5m"},
		"target": {"type": "eventbridge", "timeout": "3s", "concurrency": 4, "event_bus": "default", "source": "s.{namespace}", "detail_type": "d.{topic}"}}`,
	TypeHTTP: `{"name": "n", "match": {"namespace": "a", "topic": "b"}, "retry": {"max_attempts": 3, "base_delay": "2s", "max_delay": "1m"},
		"max_payload_bytes": 1000, "schema": {"type": "object"}, "on_dead": "park", "on_config_error": "dead", "circuit_breaker": {"failures": 5, "cool_down": "60s"}, "rate_limit": {"per_second": 100},
		"offload": {"bucket": "b-1", "threshold_bytes": 900, "prefix": "p/", "kms_key_id": "alias/k", "url_ttl": "5m"},
		"target": {"type": "http", "timeout": "3s", "concurrency": 4, "url": "http://127.0.0.1:8080/x", "signing_secret_env": "S", "headers": {"X-A": "b"}, "allow_insecure_http": true}}`,
	TypeLambda: `{"name": "n", "match": {"namespace": "a", "topic": "b"}, "retry": {"max_attempts": 3, "base_delay": "2s", "max_delay": "1m"},
		"max_payload_bytes": 1000, "schema": {"type": "object"}, "on_dead": "park", "on_config_error": "dead", "circuit_breaker": {"failures": 5, "cool_down": "60s"}, "rate_limit": {"per_second": 100},
		"offload": {"bucket": "b-1", "threshold_bytes": 900, "prefix": "p/", "kms_key_id": "alias/k", "url_ttl": "5m"},
		"target": {"type": "lambda", "timeout": "3s", "concurrency": 4, "function": "f"}}`,
}

// fullRoute is fullRoutes[typ], but for the fields of format cloudevents,
// which offload excludes: the route with those instead of offload.
func fullRoute(t *testing.T, typ, path string) string {
	if !strings.HasPrefix(path, "routes[].format") && !strings.HasPrefix(path, "routes[].cloudevents") {
		return fullRoutes[typ]
	}
	route := withoutField(t, fullRoutes[typ], "routes[].offload")
	return strings.Replace(route, "{", `{"format": "cloudevents", "cloudevents": {"source": "urn:s:{namespace}:{topic}"}, `, 1)
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

// defaultOf reads a field's value back from a parsed route, as the schema
// writes defaults.
var defaultOf = map[string]func(r *Route) string{
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

// Removing a required field fails at that field; removing any other leaves
// the route valid and takes the schema's default, which is the one the
// code applies.
func TestFieldsRequiredAndDefaultsAreTrue(t *testing.T) {
	t.Parallel()
	// Exactly one of the two is required; the schema says so apart.
	exactlyOne := map[string]bool{"routes[].target.signing_secret_env": true, "routes[].target.signing_secret_arn": true}
	fields := reference(t)
	checked := map[string]bool{}
	for _, typ := range targetTypes() {
		for _, path := range []string{"", "routes[].format"} {
			if _, err := Parse([]byte(config(fullRoute(t, typ, path))), Options{}); err != nil {
				t.Fatalf("the full %s route is invalid: %v", typ, err)
			}
		}
		for _, f := range fields {
			if f.Path == "routes" || (f.Target != "" && !slices.Contains(strings.Split(f.Target, ", "), typ)) || exactlyOne[f.Path] {
				continue
			}
			if f.Path == "routes[].retry.max_delay" || f.Path == "routes[].retry.base_delay" {
				// Removing one alone could break max_delay >= base_delay:
				// check each default against the other's default.
				continue
			}
			checked[f.Path] = true
			route := withoutField(t, fullRoute(t, typ, f.Path), f.Path)
			if f.Path == "routes[].format" {
				// cloudevents is format cloudevents' options, refused without it.
				route = withoutField(t, route, "routes[].cloudevents")
			}
			table, err := Parse([]byte(config(route)), Options{})
			concrete := strings.Replace(f.Path, "routes[]", "routes[0]", 1)
			if f.Required {
				ce, _ := err.(*ConfigError)
				if ce == nil || len(ce.Problems) == 0 || ce.Problems[0].Field != concrete {
					t.Errorf("%s without %s: err = %v, want a problem at %s", typ, f.Path, err, concrete)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s is optional in the schema, but %s without it: %v", f.Path, typ, err)
				continue
			}
			if get := defaultOf[f.Path]; get != nil {
				if got := get(table.Routes[0]); f.Default == "" || !strings.Contains(f.Default, got) {
					t.Errorf("%s: the schema's default %q, but %s has %q", f.Path, f.Default, typ, got)
				}
			} else if f.Default != "" {
				t.Errorf("%s has a default the test cannot check", f.Path)
			}
		}
	}
	// The retry delays, with the other removed too.
	route := withoutField(t, withoutField(t, fullRoutes[TypeLambda], "routes[].retry.base_delay"), "routes[].retry.max_delay")
	table, err := Parse([]byte(config(route)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		if f.Path == "routes[].retry.base_delay" || f.Path == "routes[].retry.max_delay" {
			checked[f.Path] = true
			if got := defaultOf[f.Path](table.Routes[0]); got != f.Default {
				t.Errorf("%s: the schema's default %q, parsed %q", f.Path, f.Default, got)
			}
		}
	}
	for _, f := range fields {
		if !checked[f.Path] && f.Path != "routes" && !exactlyOne[f.Path] {
			t.Errorf("%s was not checked", f.Path)
		}
	}
}

// markdownReference renders the schema's fields as docs/CONFIGURATION.md's table.
func markdownReference(t *testing.T) string {
	var b strings.Builder
	b.WriteString("| field | type | required / default | target | valid values | meaning |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, f := range reference(t) {
		need := ""
		switch {
		case f.Required:
			need = "required"
		case f.Default != "":
			need = "default " + f.Default
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", f.Path, f.Type, cell(need), cell(f.Target), cell(f.Values), cell(f.Doc))
	}
	return b.String()
}

// cell escapes text for a Markdown table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ", "<", "&lt;", ">", "&gt;").Replace(s)
}

func TestConfigurationReferenceMatchesTheSchema(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/CONFIGURATION.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- routes:begin -->\n", "<!-- routes:end -->"
	i, j := strings.Index(string(raw), begin), strings.Index(string(raw), end)
	if i < 0 || j < i {
		t.Fatal("docs/CONFIGURATION.md has no routes reference block")
	}
	if got, want := string(raw)[i+len(begin):j], markdownReference(t); got != want {
		t.Errorf("docs/CONFIGURATION.md's routes reference is out of date; between the routes markers it should read:\n\n%s", want)
	}
}

// The schema checks a duration's syntax and Go parses it: they agree on
// every non-negative duration.
func TestSchemaDurationIsGos(t *testing.T) {
	t.Parallel()
	pattern := regexp.MustCompile(schemaNode("/$defs/duration")["pattern"].(string))
	for _, s := range []string{"0", "+0", "0s", "1h30m", "500ms", "1.5h", ".5s", "1.s", "+5s", "1us", "1µs", "1μs", "2h45m30.5s",
		"", "5", "s", ".s", "1.5", "1 s", "1S", "1d", "soon", "1h-5m", "--1s", "1e3s", "0x10s", " 1s", "1s "} {
		d, err := time.ParseDuration(s)
		if matches, parses := pattern.MatchString(s), err == nil && d >= 0; matches != parses {
			t.Errorf("%q: the schema's pattern says %v, time.ParseDuration %v (%v)", s, matches, parses, err)
		}
	}
}

// The schema as a test reads it.

// schemaNode returns the object of the routes schema at a JSON Pointer
// ("/$defs/route"), its numbers as written.
func schemaNode(pointer string) map[string]any {
	dec := json.NewDecoder(bytes.NewReader(routesSchemaJSON))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		panic(err) // Parse compiles the same schema
	}
	for _, tok := range strings.Split(pointer, "/")[1:] {
		v = v.(map[string]any)[tok]
	}
	node, _ := v.(map[string]any)
	return node
}

// targetTypes are the target types of the schema's enum.
func targetTypes() []string {
	return stringList(schemaNode("/$defs/target/properties/type")["enum"])
}

// The code's list of target types is the schema's.
func TestTargetKindsAreTheSchemas(t *testing.T) {
	t.Parallel()
	if !slices.Equal(targetKinds, targetTypes()) {
		t.Errorf("targetKinds = %v, the schema's enum %v", targetKinds, targetTypes())
	}
}

// payloadMaxima are the largest max_payload_bytes by target type, from the
// route's branches of the schema.
func payloadMaxima(t testing.TB) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, b := range payloadBranches(t) {
		out[b.targetType] = b.maximum
	}
	return out
}

type payloadBranch struct {
	targetType        string
	maximum, fallback int
}

func payloadBranches(t testing.TB) []payloadBranch {
	t.Helper()
	var route struct {
		AllOf []struct {
			If struct {
				Properties struct {
					Target struct {
						Properties struct {
							Type struct {
								Const string `json:"const"`
							} `json:"type"`
						} `json:"properties"`
					} `json:"target"`
				} `json:"properties"`
			} `json:"if"`
			Then struct {
				Properties struct {
					MaxPayloadBytes struct {
						Maximum int `json:"maximum"`
						Default int `json:"default"`
					} `json:"max_payload_bytes"`
				} `json:"properties"`
			} `json:"then"`
		} `json:"allOf"`
	}
	var schema struct {
		Defs map[string]json.RawMessage `json:"$defs"`
	}
	if err := json.Unmarshal(routesSchemaJSON, &schema); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(schema.Defs["route"], &route); err != nil {
		t.Fatal(err)
	}
	var out []payloadBranch
	for _, b := range route.AllOf {
		mp := b.Then.Properties.MaxPayloadBytes
		out = append(out, payloadBranch{b.If.Properties.Target.Properties.Type.Const, mp.Maximum, mp.Default})
	}
	if len(out) != len(targetTypes()) {
		t.Fatalf("the schema has payload limits for %d target types, want %d", len(out), len(targetTypes()))
	}
	return out
}

// BenchmarkCompileRoutesSchema is what the first Parse of a process pays
// before it checks anything: compiling routes.schema.json (checked against
// its metaschema) and reading its property order and messages. A function
// pays it once, in its cold start.
//
//	go test -run '^$' -bench CompileRoutesSchema -benchmem ./shared/route
func BenchmarkCompileRoutesSchema(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		compileRoutesSchema()
	}
}
