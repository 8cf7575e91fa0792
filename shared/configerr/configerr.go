// Package configerr is the one error type for a configuration that failed
// validation: route tables, database settings, and the cold start that
// reports either. It is a leaf so every package that validates can share it.
package configerr

import (
	"cmp"
	"fmt"
	"strings"
)

// Error is a configuration that failed validation. It lists every problem
// found, not only the first, so that one deployment fixes them all; or,
// for a cold start, wraps the error that stopped it.
type Error struct {
	// Subject is who reports, the first word of Error: a package ("route",
	// "dbpool") or the function whose cold start failed.
	Subject string
	// What is the configuration's name in Error's first line;
	// "configuration" when empty.
	What string
	// Source says where the configuration came from; the validating
	// package leaves it to its caller (which names the environment
	// variable, and the file).
	Source string
	// Problems is every problem found, in the order the reporter chose.
	Problems []Problem
	// OneLine lists the problems on one line, "; " apart, so that a log
	// search for a setting's name finds the line.
	OneLine bool
	// Err is the cause, for an error that wraps another instead of
	// listing problems.
	Err error
}

// Problem is one thing wrong with a configuration.
type Problem struct {
	// Route is the index of the route a problem is in, -1 for the whole
	// route configuration; 0 outside route configurations.
	Route int
	// Field is the setting or field path at fault, such as
	// "routes[2].target.topic_arn" or "PGHOST"; "" for the configuration
	// as a whole or a text that cannot be read.
	Field string
	// Message says what is wrong and, where it helps, what would be right.
	Message string
}

// String renders the problem as "field: message", or the message alone.
func (p Problem) String() string { return strings.TrimPrefix(p.Field+": "+p.Message, ": ") }

// Error wraps Err, or lists every problem after a head saying how many
// (one per line) or, with OneLine, on one line.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Subject + ": invalid " + cmp.Or(e.What, "configuration"))
	if e.Source != "" {
		b.WriteString(" in " + e.Source)
	}
	if e.Err != nil {
		return b.String() + ": " + e.Err.Error()
	}
	if e.OneLine {
		parts := make([]string, len(e.Problems))
		for i, p := range e.Problems {
			parts[i] = p.String()
		}
		return b.String() + ": " + strings.Join(parts, "; ")
	}
	plural := "s"
	if len(e.Problems) == 1 {
		plural = ""
	}
	fmt.Fprintf(&b, " (%d problem%s):", len(e.Problems), plural)
	for _, p := range e.Problems {
		b.WriteString("\n" + p.String())
	}
	return b.String()
}

// Unwrap is the cause, if any.
func (e *Error) Unwrap() error { return e.Err }
