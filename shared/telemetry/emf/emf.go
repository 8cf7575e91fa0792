// Package emf writes CloudWatch metrics in the Embedded Metric Format (EMF):
// JSON documents written to standard output, which CloudWatch Logs turns
// into metrics. Nothing on the invocation's path calls the CloudWatch API, so
// publishing a metric costs no latency, no throttling and no IAM permission.
//
// A [Logger] collects one invocation's metrics under one namespace and a set
// of default dimensions; [Logger.Flush] writes them at the end:
//
//	m, err := emf.New("Outbox", emf.Dimension{Name: "FunctionName", Value: lambdacontext.FunctionName})
//	...
//	m.SetProperty("request_id", lc.AwsRequestID) // searchable in Logs Insights, not a metric
//	m.Put("Claimed", float64(claimed), emf.Count)
//	m.Put("DispatchLatency", float64(ms), emf.Milliseconds) // once per message: values accumulate
//	m.PutWith([]emf.Dimension{{Name: "Namespace", Value: ns}, {Name: "Topic", Value: topic}},
//		"PendingDepth", float64(depth), emf.Count)
//	m.Flush(os.Stdout)
//
// # Documents
//
// In EMF a dimension's value is a top-level member of the document, so one
// document holds one value per dimension: metrics put under different
// dimension values (PendingDepth for billing/usage and for payments/charge)
// go to separate documents. The specification caps a document at 100
// metrics and a metric at 100 values; Flush splits larger groups into
// several documents, each complete (namespace, dimensions, properties,
// timestamp) and each value written exactly once, so CloudWatch's sums and
// counts come out as if one document had held everything.
//
// Each document declares one dimension set holding all its dimensions, plus
// the roll-up sets given to [Logger.RollUp] that it can satisfy. A roll-up
// publishes the same values under fewer dimensions — for example
// PendingDepth under FunctionName alone, summed over every topic — so that
// one alarm watches the whole queue.
//
// # Validation
//
// Everything CloudWatch would reject (and it rejects a whole document for
// one bad member, silently) is refused when it is put, with an error that
// names the metric: an empty namespace or one over 255 characters or in the
// reserved AWS/ space, an empty or over-long metric or dimension name, a
// unit outside [Units], a NaN or infinite value, more than 30 dimensions in
// a set, a dimension value over 1,024 characters, or a name used twice in
// one document (as a metric, a dimension or a property).
//
// # Lambda's log filter
//
// With the JSON log format, Lambda's advanced logging controls drop every
// JSON line whose "level" is below the function's application log level,
// and take a line with no level, or one they do not know, for INFO: under
// WARN or ERROR a document without a level would be dropped with its
// metrics. So every document carries a "level" and a "timestamp" (RFC 3339,
// the instant of _aws.Timestamp): the level is INFO, or the application log
// level Lambda announces in AWS_LAMBDA_LOG_LEVEL when that is above INFO —
// the least severe level the filter lets through, so that metrics are never
// dropped and never look more severe than they must. Both names are
// reserved: no metric, dimension or property may take them.
//
// Cardinality is the caller's responsibility: every distinct combination of
// dimension values is a separate, billed CloudWatch metric. Never use an id
// as a dimension value; make it a property.
package emf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outboxkit/dispatcher/shared/telemetry/redact"
)

// The specification's and CloudWatch's limits.
const (
	// MaxMetricsPerDocument is the most metrics one document may define.
	MaxMetricsPerDocument = 100
	// MaxValuesPerMetric is the most values one metric may carry in one
	// document.
	MaxValuesPerMetric = 100
	// MaxDimensionsPerSet is the most dimension keys in one dimension set.
	MaxDimensionsPerSet = 30
	// MaxNameLength bounds namespaces, metric names and dimension names.
	MaxNameLength = 255
	// MaxDimensionValueLength bounds dimension values.
	MaxDimensionValueLength = 1024
)

// The members every document carries for Lambda's log filter, besides the
// metrics, dimensions and properties.
const (
	// LevelKey is the member Lambda's advanced logging controls read a
	// JSON line's level from.
	LevelKey = "level"
	// TimestampKey is the member Lambda reads a JSON line's time from.
	TimestampKey = "timestamp"
)

// lambdaLogLevelEnv is where Lambda announces the function's application
// log level when log-level filtering is on.
const lambdaLogLevelEnv = "AWS_LAMBDA_LOG_LEVEL"

// timestampLayout is RFC 3339 with milliseconds, in UTC, as the logs write it.
const timestampLayout = "2006-01-02T15:04:05.000Z07:00"

// maxMagnitude is the largest magnitude CloudWatch accepts for a value
// (2^360); larger values are rejected with the document.
var maxMagnitude = math.Ldexp(1, 360)

// Errors returned for what CloudWatch would reject. Test with errors.Is; the
// error text names the offending metric, dimension or property.
var (
	// ErrInvalidName: an empty, over-long or reserved namespace, metric,
	// dimension or property name.
	ErrInvalidName = errors.New("emf: invalid name")
	// ErrInvalidUnit: a unit that is not one of Units.
	ErrInvalidUnit = errors.New("emf: invalid unit")
	// ErrInvalidValue: a NaN or infinite value, one beyond ±2^360, an empty
	// or over-long dimension value, or a property that is not JSON.
	ErrInvalidValue = errors.New("emf: invalid value")
	// ErrTooManyDimensions: more than MaxDimensionsPerSet dimensions in one
	// dimension set.
	ErrTooManyDimensions = errors.New("emf: too many dimensions")
	// ErrConflict: a name used twice in one document — as a metric, a
	// dimension or a property — or one metric put with two units.
	ErrConflict = errors.New("emf: conflicting names")
)

// Dimension is one dimension of a metric: a name and its value.
type Dimension struct {
	Name  string
	Value string
}

// Logger collects metrics and writes them as EMF documents. It is safe for
// concurrent use; the zero value is not usable, call New.
type Logger struct {
	namespace string
	defaults  []Dimension
	level     string // LevelKey's value: see "Lambda's log filter"

	mu         sync.Mutex
	rollups    [][]string
	properties map[string]json.RawMessage
	groups     []*group          // in order of first use, so output is stable
	byKey      map[string]*group // canonical dimension values → group
	timestamp  time.Time
}

// group is the metrics put under one combination of dimension values: the
// content of one document (or several, when over the limits).
type group struct {
	dims    []Dimension // the defaults, then the group's own
	metrics []*metric   // in order of first put
	byName  map[string]*metric
}

type metric struct {
	name   string
	unit   Unit
	values []float64
}

// New returns a Logger for namespace whose every metric carries the default
// dimensions (typically FunctionName; at most MaxDimensionsPerSet).
func New(namespace string, defaults ...Dimension) (*Logger, error) {
	if err := checkNamespace(namespace); err != nil {
		return nil, err
	}
	if err := checkDimensions(defaults); err != nil {
		return nil, err
	}
	return &Logger{
		namespace:  namespace,
		defaults:   slices.Clone(defaults),
		level:      documentLevel(os.Getenv(lambdaLogLevelEnv)),
		properties: map[string]json.RawMessage{},
		byKey:      map[string]*group{},
	}, nil
}

// Put records one value of the metric name under the default dimensions.
// Putting the same metric again adds a value (CloudWatch then sees every
// value: its statistics and percentiles cover them all).
func (l *Logger) Put(name string, value float64, unit Unit) error {
	return l.PutWith(nil, name, value, unit)
}

// PutWith records one value of the metric name under the default dimensions
// plus dims. Metrics put with different dims values go to different
// documents.
func (l *Logger) PutWith(dims []Dimension, name string, value float64, unit Unit) error {
	if err := checkMetric(name, value, unit); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	g, err := l.groupFor(dims)
	if err != nil {
		return fmt.Errorf("metric %q: %w", name, err)
	}
	m := g.byName[name]
	if m == nil {
		if g.hasDimension(name) {
			return fmt.Errorf("%w: metric %q has the name of one of its dimensions", ErrConflict, name)
		}
		if _, ok := l.properties[name]; ok {
			return fmt.Errorf("%w: metric %q has the name of a property", ErrConflict, name)
		}
		m = &metric{name: name, unit: unit}
		g.byName[name] = m
		g.metrics = append(g.metrics, m)
	} else if m.unit != unit {
		return fmt.Errorf("%w: metric %q put in %s and in %s", ErrConflict, name, m.unit, unit)
	}
	m.values = append(m.values, value)
	return nil
}

// SetProperty adds a member that is not a metric (a request id, a worker
// id, a message id) to every document: searchable in CloudWatch Logs
// Insights next to the metrics, at no metric cost. Keys that name secrets or
// payloads (see package redact) are refused.
func (l *Logger) SetProperty(key string, value any) error {
	if err := checkName("property", key); err != nil {
		return err
	}
	if redact.SensitiveKey(key) {
		return fmt.Errorf("%w: property %q looks like a secret or a payload", ErrInvalidName, key)
	}
	raw, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("%w: property %q: %v", ErrInvalidValue, key, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range l.defaults {
		if d.Name == key {
			return fmt.Errorf("%w: property %q has the name of a dimension", ErrConflict, key)
		}
	}
	for _, g := range l.groups {
		if g.hasDimension(key) || g.byName[key] != nil {
			return fmt.Errorf("%w: property %q has the name of a metric or a dimension", ErrConflict, key)
		}
	}
	l.properties[key] = raw
	return nil
}

// RollUp declares extra dimension sets. Every document also publishes its
// metrics under each set whose keys it carries — for example []string{} (no
// dimension at all) or []string{"FunctionName"} — so that a dashboard or an
// alarm can aggregate over the dimensions a set leaves out.
func (l *Logger) RollUp(sets ...[]string) error {
	for _, set := range sets {
		if len(set) > MaxDimensionsPerSet {
			return fmt.Errorf("%w: roll-up set of %d keys (at most %d)", ErrTooManyDimensions, len(set), MaxDimensionsPerSet)
		}
		for i, k := range set {
			if err := checkName("dimension", k); err != nil {
				return err
			}
			if slices.Contains(set[:i], k) {
				return fmt.Errorf("%w: dimension %q twice in a roll-up set", ErrConflict, k)
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, set := range sets {
		l.rollups = append(l.rollups, slices.Clone(set))
	}
	return nil
}

// SetTimestamp fixes the time the metrics are published at; by default it
// is the time of Flush.
func (l *Logger) SetTimestamp(t time.Time) {
	l.mu.Lock()
	l.timestamp = t
	l.mu.Unlock()
}

// Flush writes every metric put since the last Flush to w as EMF documents,
// one JSON object per line (one Write per document), and forgets them;
// properties, roll-ups and the timestamp are kept. Nothing is written when
// no metric was put. On Lambda, w is os.Stdout.
func (l *Logger) Flush(w io.Writer) error {
	l.mu.Lock()
	docs := l.documents()
	l.groups = nil
	l.byKey = map[string]*group{}
	l.mu.Unlock()

	for _, doc := range docs {
		line, err := json.Marshal(doc)
		if err != nil {
			return fmt.Errorf("emf: encoding a document: %w", err)
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return fmt.Errorf("emf: writing a document: %w", err)
		}
	}
	return nil
}

// documentLevel is the level a document declares when the function's
// application log level is applicationLevel (AWS_LAMBDA_LOG_LEVEL; empty
// when Lambda filters nothing): INFO, or the application level when that is
// WARN, ERROR or FATAL. A level Lambda does not know gets FATAL, which no
// filter drops.
func documentLevel(applicationLevel string) string {
	switch l := strings.ToUpper(strings.TrimSpace(applicationLevel)); l {
	case "", "TRACE", "DEBUG", "INFO":
		return "INFO"
	case "WARN", "ERROR", "FATAL":
		return l
	default:
		return "FATAL"
	}
}

// groupFor returns the group for dims, creating it. The caller holds l.mu.
func (l *Logger) groupFor(dims []Dimension) (*group, error) {
	// The key is built on the stack and looked up without a string of its
	// own: the dispatch function puts a value per message delivered.
	var buf [128]byte
	key := appendGroupKey(buf[:0], dims)
	if g := l.byKey[string(key)]; g != nil {
		return g, nil
	}
	if err := checkDimensions(dims); err != nil {
		return nil, err
	}
	if n := len(l.defaults) + len(dims); n > MaxDimensionsPerSet {
		return nil, fmt.Errorf("%w: %d default and %d extra dimensions (at most %d in all)", ErrTooManyDimensions, len(l.defaults), len(dims), MaxDimensionsPerSet)
	}
	for _, d := range dims {
		for _, def := range l.defaults {
			if d.Name == def.Name {
				return nil, fmt.Errorf("%w: dimension %q is already a default dimension", ErrConflict, d.Name)
			}
		}
		if _, ok := l.properties[d.Name]; ok {
			return nil, fmt.Errorf("%w: dimension %q has the name of a property", ErrConflict, d.Name)
		}
	}
	g := &group{dims: append(slices.Clone(l.defaults), dims...), byName: map[string]*metric{}}
	l.byKey[string(key)] = g
	l.groups = append(l.groups, g)
	return g, nil
}

// appendGroupKey appends the key of a combination of dimension values,
// the same whatever the order the caller listed them in.
func appendGroupKey(b []byte, dims []Dimension) []byte {
	byName := func(a, b Dimension) int { return strings.Compare(a.Name, b.Name) }
	if !slices.IsSortedFunc(dims, byName) {
		dims = slices.Clone(dims)
		slices.SortFunc(dims, byName)
	}
	for _, d := range dims {
		b = append(append(b, d.Name...), 0)
		b = append(append(b, d.Value...), 0)
	}
	return b
}

func (g *group) hasDimension(name string) bool {
	for _, d := range g.dims {
		if d.Name == name {
			return true
		}
	}
	return false
}

// The document's JSON shapes, per the specification.
type (
	metadata struct {
		Timestamp         int64       `json:"Timestamp"`
		CloudWatchMetrics []directive `json:"CloudWatchMetrics"`
	}
	directive struct {
		Namespace  string       `json:"Namespace"`
		Dimensions [][]string   `json:"Dimensions"`
		Metrics    []definition `json:"Metrics"`
	}
	definition struct {
		Name string `json:"Name"`
		Unit Unit   `json:"Unit"`
	}
)

// part is the run of one metric's values that goes into one document.
type part struct {
	metric *metric
	values []float64
}

// documents lays the groups out as documents within the limits. The caller
// holds l.mu.
func (l *Logger) documents() []map[string]any {
	ts := l.timestamp
	if ts.IsZero() {
		ts = time.Now()
	}
	var docs []map[string]any
	for _, g := range l.groups {
		sets := l.dimensionSets(g)
		// Round r carries values [r*100, (r+1)*100) of every metric that has
		// that many, so each value is written exactly once.
		for round := 0; ; round++ {
			var parts []part
			for _, m := range g.metrics {
				from := round * MaxValuesPerMetric
				if from < len(m.values) {
					to := min(from+MaxValuesPerMetric, len(m.values))
					parts = append(parts, part{metric: m, values: m.values[from:to]})
				}
			}
			if len(parts) == 0 {
				break
			}
			for from := 0; from < len(parts); from += MaxMetricsPerDocument {
				to := min(from+MaxMetricsPerDocument, len(parts))
				docs = append(docs, l.document(g, sets, parts[from:to], ts))
			}
		}
	}
	return docs
}

func (l *Logger) document(g *group, sets [][]string, parts []part, ts time.Time) map[string]any {
	doc := make(map[string]any, len(l.properties)+len(g.dims)+len(parts)+3)
	for k, v := range l.properties {
		doc[k] = v
	}
	for _, d := range g.dims {
		doc[d.Name] = d.Value
	}
	defs := make([]definition, len(parts))
	for i, s := range parts {
		defs[i] = definition{Name: s.metric.name, Unit: s.metric.unit}
		if len(s.values) == 1 {
			doc[s.metric.name] = s.values[0]
		} else {
			doc[s.metric.name] = s.values
		}
	}
	doc[LevelKey] = l.level
	doc[TimestampKey] = ts.UTC().Format(timestampLayout)
	doc["_aws"] = metadata{
		Timestamp: ts.UnixMilli(),
		CloudWatchMetrics: []directive{{
			Namespace:  l.namespace,
			Dimensions: sets,
			Metrics:    defs,
		}},
	}
	return doc
}

// dimensionSets is the group's full set followed by the roll-ups it can
// satisfy, without duplicates. The specification wants at least one set; an
// empty set publishes the metrics without dimensions.
func (l *Logger) dimensionSets(g *group) [][]string {
	full := make([]string, len(g.dims))
	for i, d := range g.dims {
		full[i] = d.Name
	}
	sets := [][]string{full}
	seen := map[string]bool{setKey(full): true}
	for _, r := range l.rollups {
		if !l.satisfies(g, r) || seen[setKey(r)] {
			continue
		}
		seen[setKey(r)] = true
		sets = append(sets, r)
	}
	return sets
}

func (l *Logger) satisfies(g *group, set []string) bool {
	for _, k := range set {
		if !g.hasDimension(k) {
			return false
		}
	}
	return true
}

func setKey(set []string) string {
	sorted := slices.Clone(set)
	slices.Sort(sorted)
	return strings.Join(sorted, "\x00")
}

func checkNamespace(ns string) error {
	switch {
	case ns == "":
		return fmt.Errorf("%w: empty namespace", ErrInvalidName)
	case len(ns) > MaxNameLength:
		return fmt.Errorf("%w: namespace of %d characters (at most %d)", ErrInvalidName, len(ns), MaxNameLength)
	case strings.HasPrefix(ns, "AWS/"):
		return fmt.Errorf("%w: namespace %q: AWS/ is reserved for AWS services", ErrInvalidName, ns)
	case strings.HasPrefix(ns, ":"):
		return fmt.Errorf("%w: namespace %q starts with a colon", ErrInvalidName, ns)
	}
	for _, r := range ns {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) {
			return fmt.Errorf("%w: namespace %q: only printable ASCII", ErrInvalidName, ns)
		}
	}
	return nil
}

func checkMetric(name string, value float64, unit Unit) error {
	if err := checkName("metric", name); err != nil {
		return err
	}
	if !unit.Valid() {
		return fmt.Errorf("%w: metric %q: %q is not a CloudWatch unit", ErrInvalidUnit, name, unit)
	}
	if math.IsNaN(value) || math.IsInf(value, 0) {
		return fmt.Errorf("%w: metric %q: %v is not a finite number", ErrInvalidValue, name, value)
	}
	if math.Abs(value) > maxMagnitude {
		return fmt.Errorf("%w: metric %q: %g is beyond ±2^360", ErrInvalidValue, name, value)
	}
	return nil
}

// checkName validates a metric, dimension or property name: 1 to 255
// characters of UTF-8, not blank, not the reserved "_aws".
func checkName(kind, name string) error {
	switch {
	case strings.TrimSpace(name) == "":
		return fmt.Errorf("%w: empty %s name", ErrInvalidName, kind)
	case utf8.RuneCountInString(name) > MaxNameLength:
		return fmt.Errorf("%w: %s name of %d characters (at most %d): %.40q…", ErrInvalidName, kind, utf8.RuneCountInString(name), MaxNameLength, name)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %s name %q is not UTF-8", ErrInvalidName, kind, name)
	case name == "_aws":
		return fmt.Errorf("%w: %s name _aws is reserved for the EMF metadata", ErrInvalidName, kind)
	case name == LevelKey || name == TimestampKey:
		return fmt.Errorf("%w: %s name %s is reserved for Lambda's log filter", ErrInvalidName, kind, name)
	}
	return nil
}

func checkDimensions(dims []Dimension) error {
	if len(dims) > MaxDimensionsPerSet {
		return fmt.Errorf("%w: %d dimensions (at most %d)", ErrTooManyDimensions, len(dims), MaxDimensionsPerSet)
	}
	for i, d := range dims {
		if err := checkName("dimension", d.Name); err != nil {
			return err
		}
		if strings.HasPrefix(d.Name, ":") {
			return fmt.Errorf("%w: dimension %q starts with a colon", ErrInvalidName, d.Name)
		}
		for _, r := range d.Name {
			if r > unicode.MaxASCII {
				return fmt.Errorf("%w: dimension %q: only ASCII", ErrInvalidName, d.Name)
			}
		}
		switch {
		case strings.TrimSpace(d.Value) == "":
			return fmt.Errorf("%w: dimension %q has an empty value", ErrInvalidValue, d.Name)
		case utf8.RuneCountInString(d.Value) > MaxDimensionValueLength:
			return fmt.Errorf("%w: dimension %q: value of %d characters (at most %d)", ErrInvalidValue, d.Name, utf8.RuneCountInString(d.Value), MaxDimensionValueLength)
		case !utf8.ValidString(d.Value):
			return fmt.Errorf("%w: dimension %q: value is not UTF-8", ErrInvalidValue, d.Name)
		}
		for _, prev := range dims[:i] {
			if prev.Name == d.Name {
				return fmt.Errorf("%w: dimension %q given twice", ErrConflict, d.Name)
			}
		}
	}
	return nil
}
