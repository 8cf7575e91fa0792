package route

import (
	"bytes"
	"cmp"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/agnivade/levenshtein"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// routesSchemaJSON is the JSON Schema of the configuration: every field,
// its type, whether it is required, its default and the rules on its value
// alone. Editors can validate a routes file with it (see the README).
//
//go:embed routes.schema.json
var routesSchemaJSON []byte

// routesSchema is the compiled schema and what error messages look up in it.
type routesSchema struct {
	compiled *jsonschema.Schema
	doc      any                 // the schema as written, for errorMessage and enum
	order    map[string][]string // the property names of each object schema, as written, by JSON Pointer
}

// The schema is compiled at the first Parse, not when a program that never
// parses routes starts.
var loadRoutesSchema = sync.OnceValue(func() *routesSchema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(routesSchemaJSON))
	if err != nil {
		panic("route: routes.schema.json: " + err.Error())
	}
	id, _ := doc.(map[string]any)["$id"].(string)
	c := jsonschema.NewCompiler()
	c.UseLoader(noRemoteLoader{})
	if err := c.AddResource(id, doc); err != nil {
		panic("route: routes.schema.json: " + err.Error())
	}
	compiled, err := c.Compile(id)
	if err != nil {
		panic("route: routes.schema.json: " + err.Error())
	}
	return &routesSchema{compiled: compiled, doc: doc, order: propertyOrder(routesSchemaJSON)}
})

// propertyOrder lists the property names of each object schema in the order
// they are written (a decoded map has none), keyed by the JSON Pointer of
// the object schema: "" for the root, "/$defs/route".
func propertyOrder(schema []byte) map[string][]string {
	order := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(schema))
	var walk func(pointer string)
	walk = func(pointer string) {
		tok, _ := dec.Token()
		if tok != json.Delim('{') && tok != json.Delim('[') {
			return
		}
		for i := 0; dec.More(); i++ {
			child := pointer + "/" + strconv.Itoa(i)
			if tok == json.Delim('{') {
				key, _ := dec.Token()
				child = pointer + "/" + key.(string)
				if owner, ok := strings.CutSuffix(pointer, "/properties"); ok {
					order[owner] = append(order[owner], key.(string))
				}
			}
			walk(child)
		}
		dec.Token() // the closing delimiter
	}
	walk("")
	return order
}

// schemaPointer returns the JSON Pointer of a schema location
// ("…#/$defs/route"), which the library writes percent-encoded.
func schemaPointer(location string) string {
	_, fragment, _ := strings.Cut(location, "#")
	pointer, err := url.PathUnescape(fragment)
	if err != nil {
		return fragment
	}
	return pointer
}

// node returns the schema object at a location ("…#/$defs/route"), or nil.
func (s *routesSchema) node(location string) map[string]any {
	v := s.doc
	for _, tok := range strings.Split(schemaPointer(location), "/")[1:] {
		switch x := v.(type) {
		case map[string]any:
			v = x[strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i >= len(x) {
				return nil
			}
			v = x[i]
		}
	}
	m, _ := v.(map[string]any)
	return m
}

// list returns a list of strings of the schema, such as an enum.
func (s *routesSchema) list(pointer, keyword string) []string {
	list, _ := s.node("#" + pointer)[keyword].([]any)
	out := make([]string, 0, len(list))
	for _, v := range list {
		if str, ok := v.(string); ok {
			out = append(out, str)
		}
	}
	return out
}

// targetFields are the fields a target of a type may have, nil for an
// unknown type.
func (s *routesSchema) targetFields(targetType string) []string {
	if !slices.Contains(s.list("/$defs/target/properties/type", "enum"), targetType) {
		return nil
	}
	return s.order["/$defs/"+targetType]
}

// schemaProblem is a problem the schema found, before it is reported.
type schemaProblem struct {
	field, message string
	// rank orders the problems of one field: the first is reported, so
	// that an unknown field is not also judged on its value.
	rank int
	// reject silences the checks on the field's value and everything in it;
	// a problem with an object as a whole (a missing signing secret) does
	// not.
	reject bool
}

// checkSchema validates the configuration against the routes schema and
// reports what fails, one problem per field, at the field's path.
func checkSchema(doc any, fromYAML bool, ps *problems) {
	s := loadRoutesSchema()
	err := s.compiled.Validate(doc)
	if err == nil {
		return
	}
	ve, ok := errors.AsType[*jsonschema.ValidationError](err)
	if !ok {
		ps.reject("", "%v", err)
		return
	}
	var found []schemaProblem
	s.explain(ve, doc, fromYAML, &found)
	// The library's order follows Go's map order; a field comes before the
	// fields inside it, whose problems its own would silence.
	slices.SortStableFunc(found, func(a, b schemaProblem) int {
		return cmp.Or(cmp.Compare(a.field, b.field), cmp.Compare(a.rank, b.rank))
	})
	for _, p := range found {
		if p.reject {
			ps.reject(p.field, "%s", p.message)
		} else {
			ps.add(p.field, "%s", p.message)
		}
	}
}

// explain turns the library's error tree into problems. A schema object's
// "errorMessage" (the keyword VS Code's JSON and YAML language servers show
// too) replaces the messages of everything that fails inside it, but a
// value of the wrong type.
func (s *routesSchema) explain(e *jsonschema.ValidationError, doc any, fromYAML bool, out *[]schemaProblem) {
	field, value := locate(doc, e.InstanceLocation)
	node := s.node(e.SchemaURL)
	report := func(field string, rank int, reject bool, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if field == "" {
			msg = "the configuration " + msg
		}
		*out = append(*out, schemaProblem{field: field, message: msg, rank: rank, reject: reject})
	}
	_, isObject := value.(map[string]any)
	_, isList := value.([]any)
	scalar := !isObject && !isList
	if k, ok := e.ErrorKind.(*kind.Type); ok {
		report(field, 1, true, "must be %s, not %s%s", typeNames(k.Want), describe(field, value), yamlHint(fromYAML, k.Want, value))
		return
	}
	if msg, ok := node["errorMessage"].(string); ok {
		report(field, 2, scalar, "%s%s", msg, got(field, value))
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
			report(joinPath(field, name), 2, true, "is required")
		}
	case *kind.AdditionalProperties:
		at := schemaPointer(e.SchemaURL)
		targetType, _ := value.(map[string]any)["type"].(string)
		for _, name := range k.Properties {
			rank, msg := 0, s.unknownField(at, field, targetType, name)
			switch {
			case at == "/$defs/target":
				rank = 1 // the list of the target's type, if it has one, says more
			case at == "/$defs/"+targetType && slices.Contains(s.order["/$defs/target"], name):
				msg = s.foreignField(name, targetType)
			}
			report(joinPath(field, name), rank, true, "%s", msg)
		}
	default:
		// The library's own message may quote the value.
		msg := "breaks the rule " + pointer(e.ErrorKind.KeywordPath())
		if !sensitive(field) {
			msg = strings.Join(strings.Fields(k.LocalizedString(printer)), " ")
		}
		report(field, 2, scalar, "%s", msg)
	}
}

// foreignField explains a field of other target types.
func (s *routesSchema) foreignField(name, targetType string) string {
	var owners []string
	for _, t := range s.list("/$defs/target/properties/type", "enum") {
		if slices.Contains(s.targetFields(t), name) {
			owners = append(owners, t)
		}
	}
	return fmt.Sprintf("is a field of %s targets, not of %s %s target", strings.Join(owners, " and "), article(targetType), targetType)
}

// unknownField explains a field the schema does not have, suggesting the
// name that was probably meant.
func (s *routesSchema) unknownField(pointer, objField, targetType, name string) string {
	fields, what := s.order[pointer], objectName(objField)
	if own := s.targetFields(targetType); own != nil && strings.HasSuffix(objField, ".target") {
		fields, what = own, article(targetType)+" "+targetType+" target"
	}
	suggestion, closest := "", 3 // suggest names at most 2 edits away
	for _, f := range fields {
		if strings.EqualFold(f, name) {
			suggestion = fmt.Sprintf(" (did you mean %q? names are case-sensitive)", f)
			break
		}
		if d := levenshtein.ComputeDistance(f, name); len(name) >= 4 && d < closest {
			suggestion, closest = fmt.Sprintf(" (did you mean %q?)", f), d
		}
	}
	// A misspelt signing_secret_env is a typo, not an inline secret.
	if suggestion == "" && looksLikeSecret(name) {
		return secretsInline
	}
	return fmt.Sprintf("unknown field %q%s; the fields of %s are %s", name, suggestion, what, strings.Join(fields, ", "))
}

// objectName names an object of the configuration by its path.
func objectName(field string) string {
	switch {
	case field == "":
		return "the configuration"
	case strings.HasSuffix(field, "]"):
		return "a route"
	case strings.HasSuffix(field, ".retry"):
		return "a retry policy"
	}
	return "a " + field[strings.LastIndexByte(field, '.')+1:]
}

// locate returns the field path of an instance location and the value there.
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
		return fmt.Sprintf("%s[%s]", path, strconv.Quote(key))
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// describe names a JSON value with its type, for a type error; a field's
// string that may be a credential is not quoted.
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

// got quotes the value a rule refused, unless it may be a credential.
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

// sensitive reports whether a field's value may hold a credential, and so
// is never quoted: a URL, a header's value, a field named like a secret (a
// secret's ARN is only its address).
func sensitive(field string) bool {
	last := field[strings.LastIndexAny(field, ".[")+1:]
	return last == "url" || strings.Contains(field, ".headers") ||
		(looksLikeSecret(last) && !strings.HasSuffix(last, "_arn"))
}

func typeNames(want []string) string {
	names := map[string]string{"object": "an object", "array": "a list", "string": "a string", "integer": "an integer",
		"number": "a number", "boolean": "true or false", "null": "null"}
	if len(want) > 1 {
		names["boolean"] = "a boolean"
	}
	out := make([]string, len(want))
	for i, w := range want {
		out[i] = names[w]
	}
	return strings.Join(out, " or ")
}

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
	const limit = 64
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "…"
	}
	return strconv.Quote(s)
}
