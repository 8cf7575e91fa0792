package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Reader reads registered variables, applying their defaults and limits
// and collecting every problem, for this package's loaders and the
// dispatch function's (package dispatchconfig).
type Reader struct {
	getenv func(string) string
	errs   []error
}

// NewReader reads from env.
func NewReader(env Env) *Reader { return &Reader{getenv: env.getenv()} }

// Err returns every problem met so far, one per line, or nil.
func (r *Reader) Err() error { return errors.Join(r.errs...) }

// Fail records a problem with a variable that the caller found.
func (r *Reader) Fail(name, format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("%s %s", name, fmt.Sprintf(format, args...)))
}

// Raw is the variable's value, or its default when unset.
func (r *Reader) Raw(name string) string {
	v := mustLookup(name)
	if s := strings.TrimSpace(r.getenv(name)); s != "" {
		return s
	}
	return v.Default
}

// IsSet reports whether the variable has a non-empty value.
func (r *Reader) IsSet(name string) bool {
	mustLookup(name)
	return strings.TrimSpace(r.getenv(name)) != ""
}

// String is the variable's value or default.
func (r *Reader) String(name string) string { return r.Raw(name) }

// Int parses an integer within the variable's limits.
func (r *Reader) Int(name string) int {
	v := mustLookup(name)
	raw := r.Raw(name)
	if raw == "" {
		return 0
	}
	n, err := strconv.Atoi(raw)
	if err != nil {
		r.Fail(name, "must be a whole number, got %q", raw)
		return 0
	}
	if int64(n) < v.min || int64(n) > v.max {
		r.Fail(name, "must be between %d and %d, got %d", v.min, v.max, n)
	}
	return n
}

// Duration parses a Go duration ("90s", "15m") within the variable's
// limits.
func (r *Reader) Duration(name string) time.Duration {
	v := mustLookup(name)
	raw := r.Raw(name)
	if raw == "" {
		return 0
	}
	d, err := time.ParseDuration(raw)
	if err != nil {
		r.Fail(name, "must be a Go duration such as 30s or 15m, got %q", raw)
		return 0
	}
	if lo, hi := time.Duration(v.min), time.Duration(v.max); d < lo || d > hi {
		r.Fail(name, "must be between %s and %s, got %s", lo, hi, d)
	}
	return d
}

// List splits a comma-separated value, dropping empty items.
func (r *Reader) List(name string) []string {
	var out []string
	for _, item := range strings.Split(r.Raw(name), ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
