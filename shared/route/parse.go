package route

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// MaxConfigBytes caps the size of a configuration. A routing table is a few
// kilobytes; anything near this is a mistake (a wrong file).
const MaxConfigBytes = 4 << 20

// maxDepth caps the nesting of a configuration, schemas included, so that a
// hostile or broken file cannot exhaust the stack.
const maxDepth = 100

// Options are what a configuration is checked against that the
// configuration itself does not say.
type Options struct {
	// AttemptCeiling is the database's attempt ceiling, the largest
	// retry.max_attempts a route may set; the store must be given the same
	// value. Zero means outboxtype.DefaultAttemptCeiling.
	AttemptCeiling int
}

func (o Options) attemptCeiling() int {
	if o.AttemptCeiling > 0 {
		return o.AttemptCeiling
	}
	return outboxtype.DefaultAttemptCeiling
}

// Parse reads, validates and indexes a configuration, JSON or YAML. YAML is
// converted to JSON first; the JSON is validated against
// the routes schema (routes.schema.json), decoded by encoding/json, and
// given the few checks a schema cannot express. The whole configuration is
// checked; the error is a *ConfigError listing every problem.
func Parse(data []byte, opts Options) (*Table, error) {
	ps := &problems{}
	if len(data) > MaxConfigBytes {
		ps.reject("", "the configuration is %d bytes, over the limit of %d", len(data), MaxConfigBytes)
		return nil, ps.err()
	}
	jsonData, fromYAML, err := toJSON(data)
	if err == nil {
		err = checkKeys(jsonData, ps)
	}
	var doc any
	if err == nil {
		doc, err = jsonschema.UnmarshalJSON(bytes.NewReader(jsonData))
	}
	if err != nil {
		ps.reject("", "%s", err)
		return nil, ps.err()
	}
	dropAbsent(doc, 0, false)
	checkSchema(doc, fromYAML, ps)

	// Decoded as validated: without the members that stand for absent ones.
	var cfg fileConfig
	cleaned, err := json.Marshal(doc)
	if err == nil {
		err = json.Unmarshal(cleaned, &cfg)
	}
	if err != nil && len(ps.list) == 0 {
		// The schema rejects whatever encoding/json would; this is a
		// backstop should the two ever disagree.
		ps.reject("", "%v", err)
	}
	// encoding/json goes on decoding past a value of the wrong type, so cfg
	// holds every field that was right: check those too.
	table := build(&cfg, opts, ps)
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
	if out, err = json.Marshal(v); err != nil {
		return nil, true, fmt.Errorf("not valid as JSON: %v", err) // .inf, .nan
	}
	return out, true, nil
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

// checkKeys reads the JSON text for what is lost once it is decoded: a key
// written twice (the decoder keeps the second value silently) is reported
// at its path, and nesting deeper than maxDepth is an error.
func checkKeys(data []byte, ps *problems) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var walk func(path string, depth int) error
	walk = func(path string, depth int) error {
		if depth > maxDepth {
			return fmt.Errorf("%s: nested more than %d levels deep", cmp.Or(path, "the configuration"), maxDepth)
		}
		tok, err := dec.Token()
		if err != nil || (tok != json.Delim('{') && tok != json.Delim('[')) {
			return err
		}
		seen := map[string]bool{}
		for i := 0; dec.More(); i++ {
			child := path + "[" + strconv.Itoa(i) + "]"
			if tok == json.Delim('{') {
				key, err := dec.Token()
				if err != nil {
					return err
				}
				child = joinPath(path, key.(string)) // object keys are strings
				if seen[child] {
					ps.reject(child, "appears twice; a second value would silently replace the first")
				}
				seen[child] = true
			}
			if err := walk(child, depth+1); err != nil {
				return err
			}
		}
		_, err = dec.Token() // the closing delimiter
		return err
	}
	return walk("", 0)
}

// dropAbsent removes the members that stand for an absent field: null, and
// "" or false, which the configuration has always read as unset (templates
// write them). JSON Schema would judge them as values. A route's payload
// schema is left alone, where they are values ("const": null), and so is a
// header's empty value. depth is 0 for the configuration itself.
func dropAbsent(v any, depth int, headers bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			payloadSchema := depth == 2 && k == "schema"
			switch {
			case x == nil, !headers && !payloadSchema && (x == "" || x == false):
				delete(v, k)
			case !payloadSchema:
				dropAbsent(x, depth+1, depth == 3 && k == "headers")
			}
		}
	case []any:
		for _, x := range v {
			dropAbsent(x, depth+1, false)
		}
	}
}

// The decoding structs: the configuration's shape, which the schema has
// checked by the time their values are used. A zero value is an absent
// field (see dropAbsent; the schema refuses a 0), so that it can stand for
// the default. Integers are float64
// because JSON Schema's integer includes 1e3 and 2.0, which encoding/json
// refuses for an int.
type fileConfig struct {
	Routes []routeConfig `json:"routes"`
}

type routeConfig struct {
	Name            string          `json:"name"`
	Match           matchConfig     `json:"match"`
	Target          targetConfig    `json:"target"`
	Retry           retryConfig     `json:"retry"`
	MaxPayloadBytes float64         `json:"max_payload_bytes"`
	Schema          json.RawMessage `json:"schema"`
	OnDead          string          `json:"on_dead"`
	OnConfigError   string          `json:"on_config_error"`
}

type matchConfig struct {
	Namespace string `json:"namespace"`
	Topic     string `json:"topic"`
}

type targetConfig struct {
	Type        string  `json:"type"`
	Timeout     string  `json:"timeout"`
	Concurrency float64 `json:"concurrency"`

	TopicARN       string `json:"topic_arn"`
	MessageGroupID string `json:"message_group_id"`

	EventBus   string `json:"event_bus"`
	Source     string `json:"source"`
	DetailType string `json:"detail_type"`

	URL               string            `json:"url"`
	SigningSecretEnv  string            `json:"signing_secret_env"`
	SigningSecretARN  string            `json:"signing_secret_arn"`
	Headers           map[string]string `json:"headers"`
	AllowInsecureHTTP bool              `json:"allow_insecure_http"`

	Function string `json:"function"`
}

type retryConfig struct {
	MaxAttempts float64 `json:"max_attempts"`
	BaseDelay   string  `json:"base_delay"`
	MaxDelay    string  `json:"max_delay"`
}
