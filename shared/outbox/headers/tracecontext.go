package headers

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// The W3C Trace Context headers (https://www.w3.org/TR/trace-context/) a
// producer may pass as message headers. The dispatcher carries them to every
// target, so that an OpenTelemetry consumer joins the producer's trace.
const (
	TraceParent = "traceparent"
	TraceState  = "tracestate"
)

// The grammar of version 00 of the traceparent and of tracestate, as the
// specification writes it. This package keeps to the standard library (the
// producer module builds nothing but pgx), so the rules are written out
// here rather than taken from go.opentelemetry.io/otel; a test of the
// dispatcher's module holds them to otel's own parsers. The database
// refuses the same (migrations/functions/trace_context_problem.sql).
//
// The tracestate rules are compiled at the first tracestate, not when the
// program starts: a bounded repeat compiles to as many copies of its class,
// which made these two the costliest expressions of every process's start
// (the producer's and each function's cold start), while most messages
// carry no tracestate.
var (
	traceParentPattern = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-0[0-3]$`)
	traceStateKey      = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})$`)
	})
	traceStateValue = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]$`)
	})
)

// Limits the specification sets on tracestate.
const (
	MaxTraceStateBytes   = 512
	MaxTraceStateMembers = 32
)

// TraceContextProblem says what is wrong with a producer's header if its
// name is one of the trace context's, "" if nothing is (or the header is
// another). hasTraceParent tells whether the message also carries a
// traceparent, without which a tracestate means nothing.
//
// The names must be written in lowercase: a message could otherwise hold
// traceparent and Traceparent at once, which a webhook delivery would send
// as one HTTP header with two values. Only version 00 of the traceparent is
// taken, with no flags but sampled and random: what every reader parses
// the same way (OpenTelemetry drops a context with other flags set).
func TraceContextProblem(name, value string, hasTraceParent bool) string {
	lower := strings.ToLower(name)
	if lower != TraceParent && lower != TraceState {
		return ""
	}
	if name != lower {
		return fmt.Sprintf("name %q must be written %q, in lowercase", name, lower)
	}
	if name == TraceParent {
		return traceParentProblem(value)
	}
	if !hasTraceParent {
		return "tracestate is given without a traceparent"
	}
	return traceStateProblem(value)
}

func traceParentProblem(v string) string {
	switch {
	case !traceParentPattern.MatchString(v):
		return fmt.Sprintf("traceparent %q is not a version 00 traceparent (00-<32 lowercase hex trace id>-<16 lowercase hex parent id>-<flags 00 to 03>)", abbreviate(v))
	case v[3:35] == strings.Repeat("0", 32):
		return "traceparent has a trace id of all zeros, which is invalid"
	case v[36:52] == strings.Repeat("0", 16):
		return "traceparent has a parent id of all zeros, which is invalid"
	}
	return ""
}

func traceStateProblem(v string) string {
	if len(v) > MaxTraceStateBytes {
		return fmt.Sprintf("tracestate is %d bytes, over the limit of %d", len(v), MaxTraceStateBytes)
	}
	members := 0
	seen := map[string]bool{}
	for member := range strings.SplitSeq(v, ",") {
		if member == "" {
			continue // the specification allows empty members
		}
		// Spaces around a member, not inside it: as OpenTelemetry reads it.
		key, value, ok := strings.Cut(member, "=")
		key, value = strings.TrimLeft(key, " "), strings.TrimRight(value, " ")
		switch {
		case !ok || !traceStateKey().MatchString(key):
			return fmt.Sprintf("tracestate member %q is not key=value with a lowercase key", abbreviate(member))
		case !traceStateValue().MatchString(value):
			return fmt.Sprintf("tracestate member %q has a value that is empty, ends in a space or holds a comma or an equals sign", abbreviate(member))
		case seen[key]:
			return fmt.Sprintf("tracestate has the key %q twice", key)
		}
		seen[key] = true
		if members++; members > MaxTraceStateMembers {
			return fmt.Sprintf("tracestate has more than %d members", MaxTraceStateMembers)
		}
	}
	return ""
}

func abbreviate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// XRayTraceHeader is the X-Ray trace header of the same trace and parent as
// a valid traceparent, "" for anything else: X-Ray's trace id is the W3C
// one split after its first 8 hex digits (the epoch seconds X-Ray puts
// there), as AWS maps the two. The dispatcher gives it to a message that
// carries a traceparent and no X-Ray header, so that X-Ray and
// OpenTelemetry see one trace.
func XRayTraceHeader(traceParent string) string {
	if traceParentProblem(traceParent) != "" {
		return ""
	}
	sampled := "0"
	if flags := traceParent[53:55]; flags[1] == '1' || flags[1] == '3' {
		sampled = "1"
	}
	return "Root=1-" + traceParent[3:11] + "-" + traceParent[11:35] + ";Parent=" + traceParent[36:52] + ";Sampled=" + sampled
}
