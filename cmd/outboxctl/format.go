package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// humanAge writes a duration the way an operator reads it at a glance:
// "850ms", "42s", "3m12s", "2h05m", "3d04h".
func humanAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
}

// seconds converts outbox.stats()'s fractional seconds.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// count writes an integer with thousands separators: 20,000.
func count[T ~int | ~int64](n T) string {
	s := strconv.FormatInt(int64(n), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// truncate keeps s to n characters on one line, marking a cut with "…".
func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	runes := []rune(s)
	return string(runes[:n-1]) + "…"
}

// orDash shows an empty value as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// writeJSON writes v indented, for --json.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal reports whether a reader or writer is a terminal: output is
// redrawn in place only there, and stdin is read only when it is not one.
func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// parseWhen reads a time flag: an RFC 3339 time, a date (UTC midnight),
// or a duration meaning that long ago (relative to now) or, with
// future, from now.
func parseWhen(flag, value string, now time.Time, future bool) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, value); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", value); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(value); err == nil && d >= 0 {
		if future {
			return now.Add(d), nil
		}
		return now.Add(-d), nil
	}
	relative := "a duration ago such as 24h"
	if future {
		relative = "a duration from now such as 10m"
	}
	return time.Time{}, usagef("%s must be an RFC 3339 time (2026-11-21T10:00:00Z), a date (2026-11-21) or %s, got %q", flag, relative, value)
}

// writeJSONLine writes v on one line, for streams of documents.
func writeJSONLine(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }

// cause drops the operation and path an *os.PathError repeats, which the
// message already names.
func cause(err error) error {
	var pathErr *os.PathError
	if errors.As(err, &pathErr) {
		return pathErr.Err
	}
	return err
}
