package route

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/outboxkit/dispatcher/shared/configerr"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// MaxConfigBytes caps a configuration (a few kilobytes, and anything near
// this a wrong file); maxDepth its nesting, schemas included, so that a
// broken file cannot exhaust the stack.
const MaxConfigBytes, maxDepth = 4 << 20, 100

// Options are what a configuration is checked against that it does not say.
type Options struct {
	// AttemptCeiling is the database's (the store is given the same), the
	// largest retry.max_attempts; zero is outboxtype.DefaultAttemptCeiling.
	AttemptCeiling int
}

// Parse reads, validates and indexes a configuration, JSON or YAML: the
// routes schema validates it, and build makes the checks a schema cannot.
// The error is a *ConfigError listing every problem.
func Parse(data []byte, opts Options) (*Table, error) {
	ps := &problems{}
	text, fromYAML, err := jsonText(data)
	var doc any
	if err == nil {
		doc, err = readJSON(text, ps)
	}
	if err != nil {
		ps.reject("", "%s", err)
		return nil, ps.err()
	}
	checkSchema(doc, fromYAML, ps)
	// Decoded from the validated values, encoded compact with sorted keys: a
	// route's Schema is canonical (a "<" in a pattern left as written).
	var cleaned bytes.Buffer
	enc := json.NewEncoder(&cleaned)
	enc.SetEscapeHTML(false)
	var cfg fileConfig
	if err = enc.Encode(doc); err == nil {
		err = json.Unmarshal(cleaned.Bytes(), &cfg)
	}
	if err != nil && len(ps.list) == 0 {
		ps.reject("", "%v", err) // a backstop, should the schema and encoding/json ever disagree
	}
	// encoding/json goes on decoding past a value of the wrong type, so cfg
	// holds every field that was right: check those too.
	table := build(&cfg, cmp.Or(max(opts.AttemptCeiling, 0), outboxtype.DefaultAttemptCeiling), ps)
	if err := ps.err(); err != nil {
		return nil, err
	}
	return table, nil
}

// jsonText returns a configuration as JSON: text that starts with { or [
// as it is (YAML would accept some broken JSON), anything else from YAML.
func jsonText(data []byte) (text []byte, fromYAML bool, err error) {
	if len(data) > MaxConfigBytes {
		return nil, false, fmt.Errorf("the configuration is %d bytes, over the limit of %d", len(data), MaxConfigBytes)
	}
	if text = bytes.TrimSpace(data); len(text) > 0 && (text[0] == '{' || text[0] == '[') {
		var syn *json.SyntaxError
		if err = json.Unmarshal(text, new(any)); errors.As(err, &syn) {
			// Offset counts the bytes read, the offending one included.
			before := text[:max(0, min(int(syn.Offset)-1, len(text)))]
			err = fmt.Errorf("%v (line %d, column %d)", err, bytes.Count(before, []byte("\n"))+1, len(before)-bytes.LastIndexByte(before, '\n'))
		}
		if err != nil {
			err = fmt.Errorf("not valid JSON: %v", err)
		}
		return text, false, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	var v any
	if err = dec.Decode(&root); err == nil {
		keepAsWritten(&root)
		err = root.Decode(&v) // reports duplicate keys, with their lines
	}
	docs := 1
	for ; err == nil; docs++ {
		if err = dec.Decode(new(yaml.Node)); errors.Is(err, io.EOF) {
			err = nil
			break
		}
	}
	switch {
	case errors.Is(err, io.EOF) || (err == nil && v == nil):
		return nil, true, errors.New("the configuration is empty")
	case err != nil:
		return nil, true, fmt.Errorf("not valid YAML: %v%s", err, yamlAliasHint(data))
	case docs > 1:
		// Decoding only the first would drop every route after a ---.
		return nil, true, fmt.Errorf("the YAML holds %d documents (separated by ---); put every route in one document", docs)
	}
	if text, err = json.Marshal(v); err != nil {
		return nil, true, fmt.Errorf("not valid as JSON: %v", err) // .inf, .nan
	}
	return text, true, nil
}

// keepAsWritten makes YAML read as its JSON would: an unquoted timestamp
// stays the string written (a header such as Api-Version: 2024-06-20 is not
// a time), and a mapping key is a string.
func keepAsWritten(n *yaml.Node) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!timestamp" {
		n.Tag = "!!str"
	}
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 0 && c.Kind == yaml.ScalarNode && c.ShortTag() != "!!merge" {
			c.Tag = "!!str"
		}
		keepAsWritten(c)
	}
}

var bareAsterisk = regexp.MustCompile(`(?m)^[^#\n]*(:|-)[ \t]+\*[ \t]*(#.*)?$`)

// yamlAliasHint explains the commonest YAML mistake in a route table: an
// unquoted * is an alias in YAML, and the parser's error does not say where.
func yamlAliasHint(data []byte) string {
	if loc := bareAsterisk.FindIndex(data); loc != nil {
		line := bytes.Count(data[:loc[0]], []byte("\n")) + 1
		return fmt.Sprintf(`; line %d has an unquoted *, which YAML reads as an alias: write "*"`, line)
	}
	return ""
}

// readJSON decodes JSON into what JSON Schema validates (json.Number for
// numbers), reporting what decoding loses: a key written twice (the second
// value would silently win), nesting deeper than maxDepth. It drops the
// members that stand for an absent field: null, "" and false (templates
// write them), but in a payload schema ("const": null) and a header value.
func readJSON(text []byte, ps *problems) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var read func(path string, depth int, raw, headers bool) (any, error)
	read = func(path string, depth int, raw, headers bool) (any, error) {
		if depth > maxDepth {
			return nil, fmt.Errorf("%s: nested more than %d levels deep", cmp.Or(path, "the configuration"), maxDepth)
		}
		tok, err := dec.Token()
		if err != nil || (tok != json.Delim('{') && tok != json.Delim('[')) {
			return tok, err
		}
		list, obj, seen := []any{}, map[string]any{}, map[string]bool{}
		for i := 0; dec.More(); i++ {
			if tok == json.Delim('[') {
				v, err := read(path+"["+strconv.Itoa(i)+"]", depth+1, raw, false)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
				continue
			}
			key, _ := dec.Token()
			name := key.(string)
			child := joinPath(path, name)
			if seen[name] {
				ps.reject(child, "appears twice; a second value would silently replace the first")
			}
			seen[name] = true
			schema := !raw && depth == 2 && name == "schema"
			v, err := read(child, depth+1, raw || schema, !raw && depth == 3 && name == "headers")
			if err != nil {
				return nil, err
			}
			if raw || (v != nil && (schema || headers || (v != "" && v != false))) {
				obj[name] = v
			}
		}
		_, err = dec.Token() // the closing delimiter
		if tok == json.Delim('[') {
			return list, err
		}
		return obj, err
	}
	return read("", 0, false, false)
}

// The decoding structs add to Route and Target (their json tags) the fields
// that build converts. A zero value is an absent field, which build
// defaults (the schema refuses a 0). Integers are float64: JSON Schema's
// integer includes 1e3 and 2.0, which encoding/json refuses for an int.
type fileConfig struct {
	Routes []routeConfig `json:"routes"`
}

type routeConfig struct {
	Route
	Target          targetConfig `json:"target"`
	Retry           retryConfig  `json:"retry"`
	MaxPayloadBytes float64      `json:"max_payload_bytes"`
	Offload         Offload      `json:"offload"`
	Format          string       `json:"format"`
	CloudEvents     struct {
		Source string `json:"source"`
	} `json:"cloudevents"`
}

type targetConfig struct {
	Target
	Timeout     string  `json:"timeout"`
	Concurrency float64 `json:"concurrency"`
}

type retryConfig struct {
	MaxAttempts float64 `json:"max_attempts"`
	BaseDelay   string  `json:"base_delay"`
	MaxDelay    string  `json:"max_delay"`
}

// ConfigError is a configuration that failed validation: it lists every
// problem, by route index (-1, the whole configuration, first), then field.
// Parse leaves Source to its caller.
type ConfigError = configerr.Error

// Problem is one thing wrong with a configuration; Route is the index of
// the route in the routes list, -1 for the whole configuration.
type Problem = configerr.Problem

// problems collects a configuration's problems. A field whose value was
// rejected (unknown, of the wrong type) is not judged again, nor anything
// inside it.
type problems struct {
	list     []Problem
	rejected []string
}

// add reports a problem with a field not rejected, on one line (a library's
// error, or a quoted value, could break the listing).
func (ps *problems) add(field, format string, args ...any) bool {
	if slices.ContainsFunc(ps.rejected, func(r string) bool { return within(field, r) }) {
		return false
	}
	msg := fmt.Sprintf(format, args...)
	if strings.ContainsAny(msg, "\r\n") {
		msg = strings.Join(strings.Fields(msg), " ")
	}
	ps.list = append(ps.list, Problem{Route: routeOf(field), Field: field, Message: msg})
	return true
}

// reject reports a problem and silences the field's others and those inside.
func (ps *problems) reject(field, format string, args ...any) {
	if ps.add(field, format, args...) {
		ps.rejected = append(ps.rejected, field)
	}
}

// rejectedWithin reports whether the field or anything inside was rejected.
func (ps *problems) rejectedWithin(field string) bool {
	return slices.ContainsFunc(ps.rejected, func(r string) bool { return within(r, field) })
}

// within reports whether field is path or lies inside it. Names compare
// without case, as encoding/json matches them: the value of an unknown
// "Timeout" may have been decoded as the timeout.
func within(field, path string) bool {
	if len(field) < len(path) || !strings.EqualFold(field[:len(path)], path) {
		return false
	}
	rest := field[len(path):]
	return path == "" || rest == "" || rest[0] == '.' || rest[0] == '['
}

// routeOf returns the route index a field path starts with, else -1.
func routeOf(field string) int {
	var i int
	if _, err := fmt.Sscanf(field, "routes[%d]", &i); err != nil {
		return -1
	}
	return i
}

func (ps *problems) err() error {
	if len(ps.list) == 0 {
		return nil
	}
	slices.SortStableFunc(ps.list, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Route, b.Route), cmp.Compare(a.Field, b.Field))
	})
	return &ConfigError{Subject: "route", Problems: ps.list}
}
