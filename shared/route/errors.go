package route

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ErrInvalidPayload is wrapped by every *PayloadError.
var ErrInvalidPayload = errors.New("route: payload fails the route's schema")

// ConfigError is a configuration that failed validation. It lists every
// problem found, not only the first, so that one deployment fixes them all.
type ConfigError struct {
	// Source says where the configuration came from, for the first line
	// of Error; Parse leaves it empty for its caller to fill (the config
	// package names the environment variable, and the file).
	Source string
	// Problems are sorted by route index, whole-configuration problems
	// (Route -1) first, then by field.
	Problems []Problem
}

// Problem is one thing wrong with a configuration.
type Problem struct {
	// Route is the index of the route in the routes list, or -1 when the
	// problem concerns the whole configuration.
	Route int
	// Field is the path of the offending field, such as
	// "routes[2].target.topic_arn"; empty when the configuration cannot be
	// read at all.
	Field string
	// Message says what is wrong and, where it helps, what would be right.
	Message string
}

// String renders the problem as "field: message".
func (p Problem) String() string {
	if p.Field == "" {
		return p.Message
	}
	return p.Field + ": " + p.Message
}

// Error lists every problem, one per line, after a line saying how many
// there are and where the configuration came from.
func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("route: invalid configuration")
	if e.Source != "" {
		b.WriteString(" in ")
		b.WriteString(e.Source)
	}
	if len(e.Problems) == 1 {
		b.WriteString(" (1 problem):")
	} else {
		fmt.Fprintf(&b, " (%d problems):", len(e.Problems))
	}
	for _, p := range e.Problems {
		b.WriteByte('\n')
		b.WriteString(p.String())
	}
	return b.String()
}

// problems collects a configuration's problems. A field whose value was
// rejected (of the wrong type, unknown, failing the schema) is not judged
// again, nor is anything inside it.
type problems struct {
	list []Problem
	// rejected are the paths of the rejected fields.
	rejected []string
}

// add reports a problem with a field, unless the field's value or one
// around it was rejected.
func (ps *problems) add(field, format string, args ...any) {
	if ps.silenced(field) {
		return
	}
	ps.list = append(ps.list, Problem{Route: routeOf(field), Field: field, Message: oneLine(fmt.Sprintf(format, args...))})
}

// reject reports a problem with a field's value and silences the other
// problems of the field and of everything inside it.
func (ps *problems) reject(field, format string, args ...any) {
	if ps.silenced(field) {
		return
	}
	ps.add(field, format, args...)
	ps.rejected = append(ps.rejected, field)
}

func (ps *problems) silenced(field string) bool {
	return slices.ContainsFunc(ps.rejected, func(r string) bool { return within(field, r) })
}

// rejectedWithin reports whether the field or anything inside it was
// rejected: a check across fields stays silent then.
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

// oneLine keeps a message on its line of ConfigError.Error: a library's
// multi-line error, or a value quoted from the configuration, could break
// the one-problem-per-line listing.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// routeOf returns the route index a field path starts with, -1 for a path
// outside the routes list.
func routeOf(field string) int {
	rest, ok := strings.CutPrefix(field, "routes[")
	if !ok {
		return -1
	}
	digits, _, ok := strings.Cut(rest, "]")
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(digits)
	if err != nil {
		return -1
	}
	return i
}

func (ps *problems) err() error {
	if len(ps.list) == 0 {
		return nil
	}
	list := slices.Clone(ps.list)
	slices.SortStableFunc(list, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Route, b.Route), cmp.Compare(a.Field, b.Field))
	})
	return &ConfigError{Problems: list}
}

// PayloadError is a payload that fails its route's JSON Schema. The engine
// dead-letters the message with it, so its text is what an operator reads
// in the dead-letter listing.
type PayloadError struct {
	// Violations are the schema rules the payload breaks, at most
	// maxViolations of them.
	Violations []Violation
	// More counts the violations left out of Violations.
	More int
}

// Violation is one schema rule a payload breaks.
type Violation struct {
	// InstanceLocation is the JSON Pointer of the offending value in the
	// payload; "" is the payload itself.
	InstanceLocation string
	// KeywordLocation is the JSON Pointer of the rule in the schema, such
	// as "/properties/amount/minimum".
	KeywordLocation string
	// Message says what is wrong, such as "missing property 'tenant_id'".
	Message string
}

// String renders the violation as "at <location>: <message> (schema rule
// <keyword location>)".
func (v Violation) String() string {
	at := v.InstanceLocation
	if at == "" {
		at = "/"
	}
	return fmt.Sprintf("at %s: %s (schema rule %s)", at, v.Message, v.KeywordLocation)
}

// Error lists the violations on one line, separated by semicolons.
func (e *PayloadError) Error() string {
	parts := make([]string, 0, len(e.Violations)+1)
	for _, v := range e.Violations {
		parts = append(parts, v.String())
	}
	if e.More > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", e.More))
	}
	return strings.Join(parts, "; ")
}

// Unwrap makes errors.Is(err, ErrInvalidPayload) true.
func (e *PayloadError) Unwrap() error { return ErrInvalidPayload }
