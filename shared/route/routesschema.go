package route

import (
	"bytes"
	"cmp"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/agnivade/levenshtein"
	"github.com/outboxkit/dispatcher/shared/payloadschema"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

//go:embed routes.schema.json
var routesSchemaJSON []byte

// routesSchema is the compiled schema and, by the JSON Pointer of a schema
// object ("/$defs/route"), its property names in order (a map has none) and
// its errorMessage (the keyword VS Code's language servers show too).
type routesSchema struct {
	compiled *jsonschema.Schema
	order    map[string][]string
	messages map[string]string
}

// loadRoutesSchema compiles the schema at the first Parse, not at init.
var loadRoutesSchema = sync.OnceValue(compileRoutesSchema)

// compileRoutesSchema compiles routes.schema.json and reads its property
// order and messages.
func compileRoutesSchema() *routesSchema {
	c := jsonschema.NewCompiler()
	// The compiler compiles each pattern twice: checking the schema
	// against its metaschema (format "regex") and compiling it. Regular
	// expressions were most of a cold start's first Parse (20 ms of CPU):
	// each is compiled once here.
	compiled := map[string]jsonschema.Regexp{}
	c.UseRegexpEngine(func(pattern string) (jsonschema.Regexp, error) {
		if re, ok := compiled[pattern]; ok {
			return re, nil
		}
		re, err := regexp.Compile(pattern)
		if err != nil {
			return nil, err
		}
		compiled[pattern] = re
		return re, nil
	})
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(routesSchemaJSON))
	if err == nil {
		err = c.AddResource("routes.schema.json", doc)
	}
	if err != nil {
		panic("route: routes.schema.json: " + err.Error())
	}
	s := &routesSchema{c.MustCompile("routes.schema.json"), map[string][]string{}, map[string]string{}}
	dec := json.NewDecoder(bytes.NewReader(routesSchemaJSON))
	var walk func(at string)
	walk = func(at string) {
		tok, _ := dec.Token()
		if tok != json.Delim('{') && tok != json.Delim('[') {
			return
		}
		for i := 0; dec.More(); i++ {
			child := at + "/" + strconv.Itoa(i)
			if tok == json.Delim('{') {
				key, _ := dec.Token()
				child = at + payloadschema.Pointer([]string{key.(string)})
				if owner, ok := strings.CutSuffix(at, "/properties"); ok {
					s.order[owner] = append(s.order[owner], key.(string))
				}
				if key == "errorMessage" {
					msg, _ := dec.Token()
					s.messages[at] = msg.(string)
					continue
				}
			}
			walk(child)
		}
		dec.Token() // the closing delimiter
	}
	walk("")
	return s
}

// targetKinds are the schema's target types (a test keeps them equal).
var targetKinds = []string{TypeSNS, TypeEventBridge, TypeHTTP, TypeLambda}

// schemaProblem is a problem the schema found; reject silences the checks
// inside the field, which one with an object as a whole does not.
type schemaProblem struct {
	field, message string
	reject         bool
}

// checkSchema reports what fails the routes schema, at the field's path.
func checkSchema(doc any, fromYAML bool, ps *problems) {
	ve, _ := loadRoutesSchema().compiled.Validate(doc).(*jsonschema.ValidationError)
	if ve == nil {
		return
	}
	var found []schemaProblem
	loadRoutesSchema().explain(ve, doc, fromYAML, &found)
	// By field, not in the library's map order: a field comes before the
	// fields inside it, whose problems its own silences.
	slices.SortStableFunc(found, func(a, b schemaProblem) int { return cmp.Compare(a.field, b.field) })
	for _, p := range found {
		if p.reject {
			ps.reject(p.field, "%s", p.message)
		} else {
			ps.add(p.field, "%s", p.message)
		}
	}
}

// explain turns the library's error tree into problems. A schema object's
// errorMessage replaces the messages of everything that fails inside it,
// but a value of the wrong type.
func (s *routesSchema) explain(e *jsonschema.ValidationError, doc any, fromYAML bool, out *[]schemaProblem) {
	field, value := locate(doc, e.InstanceLocation)
	report := func(field string, reject bool, format string, args ...any) {
		if field == "" {
			format = "the configuration " + format
		}
		*out = append(*out, schemaProblem{field, fmt.Sprintf(format, args...), reject})
	}
	_, isObject := value.(map[string]any)
	_, isList := value.([]any)
	scalar := !isObject && !isList
	_, at, _ := strings.Cut(e.SchemaURL, "#")
	at, _ = url.PathUnescape(at) // the schema's JSON Pointer, which the library percent-encodes
	if k, ok := e.ErrorKind.(*kind.Type); ok {
		report(field, true, "must be %s, not %s%s", typeNames(k.Want), describe(field, value), yamlHint(fromYAML, k.Want, value))
		return
	} else if msg, ok := s.messages[at]; ok {
		report(field, scalar, "%s%s", msg, got(field, value))
		return
	}
	for _, c := range e.Causes {
		s.explain(c, doc, fromYAML, out)
	}
	if len(e.Causes) > 0 {
		return
	}
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		for _, name := range k.Missing {
			report(joinPath(field, name), true, "is required")
		}
	case *kind.AdditionalProperties:
		targetType, _ := strings.CutPrefix(at, "/$defs/")
		for _, name := range k.Properties {
			msg := s.unknownField(at, name)
			switch typ, _ := value.(map[string]any)["type"].(string); {
			case at == "/$defs/target" && slices.Contains(targetKinds, typ):
				continue // the type's own list says more
			case slices.Contains(targetKinds, targetType) && slices.Contains(s.order["/$defs/target"], name):
				owners := slices.DeleteFunc(slices.Clone(targetKinds), func(t string) bool { return !slices.Contains(s.order["/$defs/"+t], name) })
				msg = fmt.Sprintf("is a field of %s targets, not of %s", strings.Join(owners, " and "), objectNames[at])
			}
			report(joinPath(field, name), true, "%s", msg)
		}
	default:
		msg := "breaks the rule " + payloadschema.Pointer(e.ErrorKind.KeywordPath())
		if !sensitive(field) { // else the library's own message may quote the value
			msg = strings.Join(strings.Fields(k.LocalizedString(payloadschema.Printer)), " ")
		}
		report(field, scalar, "%s", msg)
	}
}

// unknownField explains a field the schema object at a pointer does not
// have, suggesting the name meant: one differing only in case, or by at
// most two edits (Levenshtein distance) in a name of four letters or more.
func (s *routesSchema) unknownField(at, name string) string {
	suggestion, closest := "", 3
	for _, f := range s.order[at] {
		if strings.EqualFold(f, name) {
			suggestion = fmt.Sprintf(" (did you mean %q? names are case-sensitive)", f)
			break
		}
		if d := levenshtein.ComputeDistance(f, name); len(name) >= 4 && d < closest {
			suggestion, closest = fmt.Sprintf(" (did you mean %q?)", f), d
		}
	}
	if suggestion == "" && looksLikeSecret(name) { // a misspelt signing_secret_env is a typo, not an inline secret
		return secretsInline
	}
	return fmt.Sprintf("unknown field %q%s; the fields of %s are %s", name, suggestion,
		cmp.Or(objectNames[at], "a "+at[strings.LastIndexByte(at, '/')+1:]), strings.Join(s.order[at], ", "))
}

// objectNames name the objects of the schema, by JSON Pointer.
var objectNames = map[string]string{"": "the configuration", "/$defs/route": "a route", "/$defs/match": "a match", "/$defs/retry": "a retry policy",
	"/$defs/target": "a target", "/$defs/sns": "an sns target", "/$defs/eventbridge": "an eventbridge target", "/$defs/http": "an http target", "/$defs/lambda": "a lambda target"}

// locate returns the field path of an instance location, and its value.
func locate(doc any, location []string) (field string, value any) {
	value = doc
	for _, tok := range location {
		switch v := value.(type) {
		case []any:
			i, _ := strconv.Atoi(tok)
			field, value = field+"["+tok+"]", v[i]
		case map[string]any:
			field, value = joinPath(field, tok), v[tok]
		}
	}
	return field, value
}

var simpleKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// joinPath appends an object key to a field path: routes[0].target.url.
func joinPath(path, key string) string {
	if !simpleKey.MatchString(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	return strings.TrimPrefix(path+"."+key, ".")
}

// describe names a value with its type.
func describe(field string, v any) string {
	switch v := v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		if sensitive(field) {
			return "a string"
		}
		return "the string " + truncateQuoted(v)
	case json.Number:
		return "the number " + v.String()
	case bool:
		return "the boolean " + strconv.FormatBool(v)
	}
	return "null"
}

// got quotes the value a rule refused, unless it is sensitive: a URL, a
// header's value, a field named like a secret (an ARN is an address).
func got(field string, v any) string {
	switch v := v.(type) {
	case string:
		if !sensitive(field) {
			return "; got " + truncateQuoted(v)
		}
	case json.Number:
		return "; got " + v.String()
	}
	return ""
}

func sensitive(field string) bool {
	last := field[strings.LastIndexAny(field, ".[")+1:]
	return last == "url" || strings.Contains(field, ".headers") || (looksLikeSecret(last) && !strings.HasSuffix(last, "_arn"))
}

var typeName = map[string]string{"object": "an object", "array": "a list", "string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean", "null": "null"}

func typeNames(want []string) string {
	if slices.Equal(want, []string{"boolean"}) {
		return "true or false"
	}
	out := make([]string, len(want))
	for i, w := range want {
		out[i] = typeName[w]
	}
	return strings.Join(out, " or ")
}

// yamlHint explains a YAML value read as another type than a string.
func yamlHint(fromYAML bool, want []string, v any) string {
	if !fromYAML || !slices.Contains(want, "string") {
		return ""
	}
	switch v.(type) {
	case bool, json.Number:
		return "; YAML reads unquoted true, false and numbers as such: quote the value"
	case map[string]any:
		return "; in YAML a value that starts with { is a mapping: quote it"
	}
	return ""
}

func truncateQuoted(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "…"
	}
	return strconv.Quote(s)
}
