package route

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	goyaml "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

// The environment variables FromEnv reads.
const (
	// EnvRoutes holds the configuration itself (JSON; YAML is accepted).
	EnvRoutes = "OUTBOX_ROUTES"
	// EnvRoutesFile holds the path of a file with the configuration, JSON
	// or YAML (told apart by content, not by the file name).
	EnvRoutesFile = "OUTBOX_ROUTES_FILE"
)

// MaxConfigBytes caps the size of a configuration. A routing table is a few
// kilobytes; anything near this is a mistake (a wrong file).
const MaxConfigBytes = 4 << 20

// maxDepth caps the nesting of a configuration, schemas included, so that a
// hostile or broken file cannot exhaust the stack.
const maxDepth = 100

// FromEnv loads the configuration named by the environment: OUTBOX_ROUTES
// (the configuration as text) or OUTBOX_ROUTES_FILE (a path). Exactly one
// must be set. getenv is os.Getenv and readFile os.ReadFile in production.
// A configuration that fails validation returns a *ConfigError whose Source
// names the variable (and the file).
func FromEnv(getenv func(string) string, readFile func(string) ([]byte, error)) (*Table, error) {
	text, path := getenv(EnvRoutes), getenv(EnvRoutesFile)
	var (
		data   []byte
		source string
	)
	switch {
	case text != "" && path != "":
		return nil, fmt.Errorf("route: both %s and %s are set; set exactly one", EnvRoutes, EnvRoutesFile)
	case text == "" && path == "":
		return nil, fmt.Errorf("%w: set %s (the configuration as JSON) or %s (the path of a JSON or YAML file)",
			ErrNotConfigured, EnvRoutes, EnvRoutesFile)
	case text != "":
		data, source = []byte(text), EnvRoutes
	default:
		var err error
		if data, err = readFile(path); err != nil {
			return nil, fmt.Errorf("route: %s: reading %q: %w", EnvRoutesFile, path, err)
		}
		source = fmt.Sprintf("%s %q", EnvRoutesFile, path)
	}
	t, err := Parse(data)
	if err != nil {
		if ce, ok := errors.AsType[*ConfigError](err); ok {
			ce.Source = source
		}
		return nil, err
	}
	return t, nil
}

// Parse reads, validates and indexes a configuration, JSON or YAML. YAML is
// converted to JSON first (sigs.k8s.io/yaml), then the JSON is decoded once,
// strictly, by encoding/json. The whole configuration is checked; the error
// is a *ConfigError listing every problem.
func Parse(data []byte) (*Table, error) {
	ps := &problems{}
	if len(data) > MaxConfigBytes {
		ps.reject("", "the configuration is %d bytes, over the limit of %d", len(data), MaxConfigBytes)
		return nil, ps.err()
	}
	jsonData, fromYAML, err := toJSON(data)
	if err != nil {
		ps.reject("", "%s", err)
		return nil, ps.err()
	}
	root, err := readTree(jsonData, ps)
	if err != nil {
		ps.reject("", "%v", err)
		return nil, ps.err()
	}
	if root.kind != kindObject {
		ps.reject("", `the configuration must be an object with a "routes" list, not %s`, root.describe())
		return nil, ps.err()
	}
	checkStructure(root, reflect.TypeFor[fileConfig](), "", ps, fromYAML)

	var cfg fileConfig
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil && len(ps.list) == 0 {
		// The structural pass reports everything the decoder rejects, with
		// a path; this is a backstop should the two ever disagree.
		ps.reject("", "%v", err)
	}
	// encoding/json goes on decoding past a type error or an unknown field,
	// so cfg holds every field that was right: check their meaning too.
	table := build(&cfg, ps)
	if err := ps.err(); err != nil {
		return nil, err
	}
	table.index()
	return table, nil
}

// toJSON returns the configuration as JSON. Text that starts with { or [
// is JSON and is used as it is (YAML 1.1 would accept some broken JSON, and
// reject some valid JSON such as the escape \/); anything else is YAML.
func toJSON(data []byte) (out []byte, fromYAML bool, err error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[') {
		if !json.Valid(trimmed) {
			return nil, false, fmt.Errorf("not valid JSON: %s", describeJSONError(trimmed))
		}
		return trimmed, false, nil
	}
	out, err = yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, true, fmt.Errorf("not valid YAML: %v%s", err, yamlAliasHint(data))
	}
	if n := yamlDocuments(data); n > 1 {
		return nil, true, fmt.Errorf("the YAML holds %d documents (separated by ---); put every route in one document", n)
	}
	if bytes.Equal(out, []byte("null")) {
		return nil, true, errors.New("the configuration is empty")
	}
	return out, true, nil
}

// describeJSONError locates a JSON syntax error by line and column.
func describeJSONError(data []byte) string {
	var v any
	err := json.Unmarshal(data, &v)
	var syn *json.SyntaxError
	if !errors.As(err, &syn) {
		if err == nil {
			return "unknown error"
		}
		return err.Error()
	}
	// Offset counts the bytes read, the offending one included.
	line, col := 1, 1
	for _, c := range data[:max(0, min(int(syn.Offset)-1, len(data)))] {
		if c == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return fmt.Sprintf("%v (line %d, column %d)", syn, line, col)
}

// yamlDocuments counts the documents in a YAML stream: yaml.Unmarshal
// silently reads only the first, which would drop every route after a ---.
func yamlDocuments(data []byte) int {
	dec := goyaml.NewDecoder(bytes.NewReader(data))
	n := 0
	for {
		var v any
		if err := dec.Decode(&v); err != nil {
			return n
		}
		n++
	}
}

var bareAsterisk = regexp.MustCompile(`(?m)^[^#\n]*(:|-)[ \t]+\*[ \t]*(#.*)?$`)

// yamlAliasHint explains the commonest YAML mistake in a route table: an
// unquoted * is an alias in YAML, and the parser's error does not say where.
func yamlAliasHint(data []byte) string {
	loc := bareAsterisk.FindIndex(data)
	if loc == nil {
		return ""
	}
	line := bytes.Count(data[:loc[0]], []byte("\n")) + 1
	return fmt.Sprintf(`; line %d has an unquoted *, which YAML reads as an alias: write "*"`, line)
}

// The decoding structs: the configuration's exact shape. checkStructure and
// the Fields documentation test derive the valid field names from their json
// tags; a `target` tag says which target type a target field belongs to.
// Pointers tell an absent field from an explicit zero.
type fileConfig struct {
	Routes []routeConfig `json:"routes"`
}

type routeConfig struct {
	Name            string          `json:"name"`
	Match           *matchConfig    `json:"match"`
	Target          *targetConfig   `json:"target"`
	Retry           *retryConfig    `json:"retry"`
	MaxPayloadBytes *int            `json:"max_payload_bytes"`
	Schema          json.RawMessage `json:"schema"`
	OnDead          *string         `json:"on_dead"`
	OnConfigError   *string         `json:"on_config_error"`
}

type matchConfig struct {
	Namespace string `json:"namespace"`
	Topic     string `json:"topic"`
}

type targetConfig struct {
	Type        string  `json:"type"`
	Timeout     *string `json:"timeout"`
	Concurrency *int    `json:"concurrency"`

	TopicARN       string `json:"topic_arn" target:"sns"`
	MessageGroupID string `json:"message_group_id" target:"sns"`

	EventBus   string `json:"event_bus" target:"eventbridge"`
	Source     string `json:"source" target:"eventbridge"`
	DetailType string `json:"detail_type" target:"eventbridge"`

	URL               string            `json:"url" target:"http"`
	SigningSecretEnv  string            `json:"signing_secret_env" target:"http"`
	SigningSecretARN  string            `json:"signing_secret_arn" target:"http"`
	Headers           map[string]string `json:"headers" target:"http"`
	AllowInsecureHTTP bool              `json:"allow_insecure_http" target:"http"`

	Function string `json:"function" target:"lambda"`
}

type retryConfig struct {
	MaxAttempts *int    `json:"max_attempts"`
	BaseDelay   *string `json:"base_delay"`
	MaxDelay    *string `json:"max_delay"`
}

// structField is one field of a decoding struct.
type structField struct {
	name   string // the JSON name
	typ    reflect.Type
	target string // the target type it belongs to; "" for all
	index  int
}

var structFieldsCache sync.Map // reflect.Type → []structField

func structFields(t reflect.Type) []structField {
	if v, ok := structFieldsCache.Load(t); ok {
		return v.([]structField)
	}
	var out []structField
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		out = append(out, structField{name: name, typ: f.Type, target: f.Tag.Get("target"), index: i})
	}
	structFieldsCache.Store(t, out)
	return out
}

func fieldNamed(t reflect.Type, name string) (structField, bool) {
	for _, f := range structFields(t) {
		if f.name == name {
			return f, true
		}
	}
	return structField{}, false
}

// fieldsOfTarget are the valid field names of a target of a type, in
// declaration order; all of them when the type is not a known one.
func fieldsOfTarget(targetType string) []string {
	known := slices.Contains(TargetTypes, targetType)
	var out []string
	for _, f := range structFields(reflect.TypeFor[targetConfig]()) {
		if f.target == "" || !known || f.target == targetType {
			out = append(out, f.name)
		}
	}
	return out
}

// targetTypeOf returns the type a target field belongs to, "" for a field
// common to all types.
func targetTypeOf(field string) string {
	f, _ := fieldNamed(reflect.TypeFor[targetConfig](), field)
	return f.target
}

// node is a JSON value as written, object keys in order: the structural
// pass reports unknown, duplicate and mistyped fields from it, with their
// paths, before encoding/json decodes the same text into the structs.
type node struct {
	kind  nodeKind
	keys  []string
	props map[string]*node
	items []*node
	text  string // a string's value, a number's literal, "true" or "false"
}

type nodeKind uint8

const (
	kindNull nodeKind = iota
	kindObject
	kindArray
	kindString
	kindNumber
	kindBool
)

func (n *node) describe() string {
	switch n.kind {
	case kindObject:
		return "an object"
	case kindArray:
		return "a list"
	case kindString:
		return fmt.Sprintf("the string %s", truncateQuoted(n.text))
	case kindNumber:
		return "the number " + n.text
	case kindBool:
		return "the boolean " + n.text
	}
	return "null"
}

func truncateQuoted(s string) string {
	const limit = 64
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "…"
	}
	return strconv.Quote(s)
}

// readTree reads JSON text into a node tree, reporting duplicate keys.
func readTree(data []byte, ps *problems) (*node, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	root, err := readNode(dec, "", 0, ps)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("unexpected data after the configuration")
	}
	return root, nil
}

func readNode(dec *json.Decoder, path string, depth int, ps *problems) (*node, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("%s: nested more than %d levels deep", displayPath(path), maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch v := tok.(type) {
	case json.Delim:
		if v == '[' {
			n := &node{kind: kindArray}
			for i := 0; dec.More(); i++ {
				item, err := readNode(dec, fmt.Sprintf("%s[%d]", path, i), depth+1, ps)
				if err != nil {
					return nil, err
				}
				n.items = append(n.items, item)
			}
			_, err := dec.Token() // ]
			return n, err
		}
		n := &node{kind: kindObject, props: map[string]*node{}}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return nil, err
			}
			key := tok.(string) // object keys are always strings
			child, err := readNode(dec, joinPath(path, key), depth+1, ps)
			if err != nil {
				return nil, err
			}
			if _, dup := n.props[key]; dup {
				ps.reject(joinPath(path, key), "appears twice; a second value would silently replace the first")
				continue
			}
			n.keys = append(n.keys, key)
			n.props[key] = child
		}
		_, err := dec.Token() // }
		return n, err
	case string:
		return &node{kind: kindString, text: v}, nil
	case json.Number:
		return &node{kind: kindNumber, text: v.String()}, nil
	case bool:
		return &node{kind: kindBool, text: strconv.FormatBool(v)}, nil
	default:
		return &node{kind: kindNull}, nil
	}
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

func displayPath(path string) string {
	if path == "" {
		return "the configuration"
	}
	return path
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// checkStructure compares a node tree with a decoding struct type and
// reports, with their paths, the fields that encoding/json would reject:
// unknown fields (secrets given inline first) and values of the wrong JSON
// type. null counts as absent everywhere, as it does for encoding/json.
func checkStructure(n *node, t reflect.Type, path string, ps *problems, fromYAML bool) {
	if n.kind == kindNull {
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType {
		return // any JSON value; its meaning is checked later
	}
	wrongType := func(want string) {
		msg := fmt.Sprintf("must be %s, not %s", want, n.describe())
		switch {
		case fromYAML && t.Kind() == reflect.String && (n.kind == kindBool || n.kind == kindNumber):
			msg += `; YAML reads unquoted yes, no, on, off, true, false and numbers as such: quote the value`
		case fromYAML && t.Kind() == reflect.String && n.kind == kindObject:
			msg += `; in YAML a value that starts with { is a mapping: quote it`
		}
		ps.reject(path, "%s", msg)
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.kind != kindObject {
			wrongType("an object")
			return
		}
		for _, key := range n.keys {
			child := n.props[key]
			f, ok := fieldNamed(t, key)
			if !ok {
				reportUnknownField(n, t, path, key, ps)
				continue
			}
			checkStructure(child, f.typ, joinPath(path, key), ps, fromYAML)
		}
	case reflect.Slice:
		if n.kind != kindArray {
			wrongType("a list")
			return
		}
		for i, item := range n.items {
			checkStructure(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), ps, fromYAML)
		}
	case reflect.Map:
		if n.kind != kindObject {
			wrongType("an object")
			return
		}
		for _, key := range n.keys {
			checkStructure(n.props[key], t.Elem(), joinPath(path, key), ps, fromYAML)
		}
	case reflect.String:
		if n.kind != kindString {
			wrongType("a string")
		}
	case reflect.Int:
		if n.kind != kindNumber {
			wrongType("an integer")
		} else if _, err := strconv.ParseInt(n.text, 10, strconv.IntSize); errors.Is(err, strconv.ErrRange) {
			ps.reject(path, "%s is too large", n.text)
		} else if err != nil {
			ps.reject(path, "must be a whole number written without a fraction or exponent, not %s", n.text)
		}
	case reflect.Bool:
		if n.kind != kindBool {
			wrongType("true or false")
		}
	default:
		panic("route: no structural check for " + t.String())
	}
}

// objectNames name the decoding structs in messages.
var objectNames = map[reflect.Type]string{
	reflect.TypeFor[fileConfig]():   "the configuration",
	reflect.TypeFor[routeConfig]():  "a route",
	reflect.TypeFor[matchConfig]():  "a match",
	reflect.TypeFor[targetConfig](): "a target",
	reflect.TypeFor[retryConfig]():  "a retry policy",
}

func reportUnknownField(obj *node, t reflect.Type, path, key string, ps *problems) {
	field := joinPath(path, key)
	suggestion, closest := "", 3 // suggest names at most 2 edits away
	for _, f := range structFields(t) {
		if strings.EqualFold(f.name, key) {
			suggestion = fmt.Sprintf(" (did you mean %q? names are case-sensitive)", f.name)
			// encoding/json matches names case-insensitively, so this value
			// may have replaced the real field's: judge neither.
			ps.rejected = append(ps.rejected, joinPath(path, f.name))
			break
		}
		if d := editDistance(f.name, key); len(key) >= 4 && d < closest {
			suggestion, closest = fmt.Sprintf(" (did you mean %q?)", f.name), d
		}
	}
	// A misspelt signing_secret_env is a typo, not an inline secret.
	if suggestion == "" && looksLikeSecret(key) {
		ps.reject(field, "%s", secretsInline)
		return
	}
	var valid []string
	what := objectNames[t]
	if t == reflect.TypeFor[targetConfig]() {
		typ := ""
		if n := obj.props["type"]; n != nil && n.kind == kindString && slices.Contains(TargetTypes, n.text) {
			typ = n.text
			what = article(typ) + " " + typ + " target"
		}
		valid = fieldsOfTarget(typ)
	} else {
		for _, f := range structFields(t) {
			valid = append(valid, f.name)
		}
	}
	ps.reject(field, "unknown field %s%s; the fields of %s are %s", strconv.Quote(key), suggestion, what, strings.Join(valid, ", "))
}

// editDistance is the optimal-string-alignment distance between two short
// names (insertions, deletions, substitutions and transpositions of
// adjacent letters), for suggesting the field a misspelt one meant.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// article is the indefinite article of a target type as it is spoken:
// an SNS, an EventBridge, an HTTP, a Lambda target.
func article(targetType string) string {
	if targetType == TypeLambda {
		return "a"
	}
	return "an"
}

// looksLikeSecret reports whether a field or header name suggests that a
// credential is being written into the configuration, which is readable by
// anyone who can read the function's configuration.
func looksLikeSecret(name string) bool {
	n := strings.NewReplacer("_", "", "-", "", ".", "", " ", "").Replace(strings.ToLower(name))
	for _, s := range []string{"secret", "password", "passwd", "token", "apikey", "credential", "privatekey", "accesskey", "authorization", "bearer", "cookie"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}
