package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// reader reads registered variables, applying their defaults and limits
// and collecting every problem.
type reader struct {
	getenv func(string) string
	errs   []error
}

func newReader(env Env) *reader { return &reader{getenv: env.getenv()} }

// err returns every problem met so far, one per line, or nil.
func (r *reader) err() error { return errors.Join(r.errs...) }

// fail records a problem with a variable.
func (r *reader) fail(name, format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("%s %s", name, fmt.Sprintf(format, args...)))
}

// raw is the variable's value, or its default when unset.
func (r *reader) raw(name string) string {
	v := mustLookup(name)
	if s := strings.TrimSpace(r.getenv(name)); s != "" {
		return s
	}
	return v.Default
}

// isSet reports whether the variable has a non-empty value.
func (r *reader) isSet(name string) bool {
	mustLookup(name)
	return strings.TrimSpace(r.getenv(name)) != ""
}

// string is the variable's value or default.
func (r *reader) string(name string) string { return r.raw(name) }

// int parses an integer within the variable's limits.
func (r *reader) int(name string) int {
	v := mustLookup(name)
	raw := r.raw(name)
	if raw == "" {
		return 0
	}
	n, err := strconv.Atoi(raw)
	if err != nil {
		r.fail(name, "must be a whole number, got %q", raw)
		return 0
	}
	if int64(n) < v.min || int64(n) > v.max {
		r.fail(name, "must be between %d and %d, got %d", v.min, v.max, n)
	}
	return n
}

// duration parses a Go duration ("90s", "15m") within the variable's
// limits.
func (r *reader) duration(name string) time.Duration {
	v := mustLookup(name)
	raw := r.raw(name)
	if raw == "" {
		return 0
	}
	d, err := time.ParseDuration(raw)
	if err != nil {
		r.fail(name, "must be a Go duration such as 30s or 15m, got %q", raw)
		return 0
	}
	if lo, hi := time.Duration(v.min), time.Duration(v.max); d < lo || d > hi {
		r.fail(name, "must be between %s and %s, got %s", lo, hi, d)
	}
	return d
}

// list splits a comma-separated value, dropping empty items.
func (r *reader) list(name string) []string {
	var out []string
	for _, item := range strings.Split(r.raw(name), ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
