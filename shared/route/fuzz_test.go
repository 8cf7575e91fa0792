package route

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// FuzzParse checks that Parse never panics, that it returns a table or a
// *ConfigError, and that a table it returns is sound: every route within
// its limits, and Match agreeing with a plain scan of the routes. The seed
// corpus is in testdata/fuzz/FuzzParse; plain go test runs it.
func FuzzParse(f *testing.F) {
	f.Add([]byte(precedenceTable), "payments", "refund")
	f.Fuzz(func(t *testing.T, data []byte, namespace, topic string) {
		table, err := Parse(data, Options{})
		if (table == nil) == (err == nil) {
			t.Fatalf("Parse returned table %v and error %v; want exactly one", table, err)
		}
		if err != nil {
			checkConfigError(t, err)
			return
		}
		checkTable(t, table)

		probes := [][2]string{{namespace, topic}, {"*", "*"}, {"", ""}}
		for _, r := range table.Routes {
			probes = append(probes,
				[2]string{r.Match.Namespace, r.Match.Topic},
				[2]string{r.Match.Namespace, topic},
				[2]string{namespace, r.Match.Topic})
		}
		for _, p := range probes {
			got, want := table.Match(p[0], p[1]), scanMatch(table, p[0], p[1])
			if got != want {
				t.Fatalf("Match(%q, %q) = %v, want %v", p[0], p[1], got, want)
			}
			if got != nil && !got.Match.Matches(p[0], p[1]) {
				t.Fatalf("Match(%q, %q) returned %s, whose pattern %s does not match", p[0], p[1], got.Name, got.Match)
			}
		}
	})
}

func checkConfigError(t *testing.T, err error) {
	t.Helper()
	ce, ok := errors.AsType[*ConfigError](err)
	if !ok {
		t.Fatalf("error %v is a %T, want a *ConfigError", err, err)
	}
	if len(ce.Problems) == 0 {
		t.Fatal("a *ConfigError without problems")
	}
	for _, p := range ce.Problems {
		if p.Message == "" || strings.ContainsAny(p.Message, "\r\n") {
			t.Fatalf("problem %q: a message must be one non-empty line", p)
		}
		if p.Route != routeOf(p.Field) {
			t.Fatalf("problem %q has Route %d", p, p.Route)
		}
	}
	if !slices.IsSortedFunc(ce.Problems, func(a, b Problem) int { return a.Route - b.Route }) {
		t.Fatalf("problems not sorted by route: %v", ce.Problems)
	}
}

func checkTable(t *testing.T, table *Table) {
	t.Helper()
	if len(table.Routes) == 0 {
		t.Fatal("a table without routes")
	}
	seen := map[Match]bool{}
	for i, r := range table.Routes {
		maxPayload, ok := payloadMaxima(t)[r.Target.Type]
		switch {
		case r.Index != i:
			t.Fatalf("Routes[%d].Index = %d", i, r.Index)
		case !ok:
			t.Fatalf("route %d has target type %q", i, r.Target.Type)
		case seen[r.Match]:
			t.Fatalf("two routes match %s", r.Match)
		case r.Retry.Validate() != nil:
			t.Fatalf("route %d: %v", i, r.Retry.Validate())
		case r.Retry.MaxAttempts > outboxtype.DefaultAttemptCeiling:
			t.Fatalf("route %d: max attempts %d", i, r.Retry.MaxAttempts)
		case r.Timeout <= 0 || r.Timeout > MaxTimeout || r.Target.Timeout != r.Timeout:
			t.Fatalf("route %d: timeout %s", i, r.Timeout)
		case r.MaxPayloadBytes < 1 || r.MaxPayloadBytes > maxPayload || r.Target.MaxPayloadBytes != r.MaxPayloadBytes:
			t.Fatalf("route %d: max payload %d", i, r.MaxPayloadBytes)
		case r.Target.Key() == "" || r.Target.Key() != r.Target.computeKey():
			t.Fatalf("route %d: key %q", i, r.Target.Key())
		case r.Name == "":
			t.Fatalf("route %d has no name", i)
		}
		seen[r.Match] = true
		_ = r.CheckPayload([]byte(`{"tenant_id": "t"}`))
	}
}

// scanMatch is Match's specification: among the routes whose pattern
// matches, the one with the most specific pattern (exact namespace counts
// more than exact topic).
func scanMatch(table *Table, namespace, topic string) *Route {
	var best *Route
	bestRank := -1
	for _, r := range table.Routes {
		if !r.Match.Matches(namespace, topic) {
			continue
		}
		rank := 0
		if r.Match.Namespace != Wildcard {
			rank += 2
		}
		if r.Match.Topic != Wildcard {
			rank++
		}
		if rank > bestRank {
			best, bestRank = r, rank
		}
	}
	return best
}

// The seed corpus holds valid configurations of every target type and
// broken ones; its file names say which, so that an edit cannot quietly
// turn a valid seed into a broken one.
func TestFuzzCorpusSeeds(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir("testdata/fuzz/FuzzParse")
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]bool{}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join("testdata/fuzz/FuzzParse", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		literal, ok := strings.CutPrefix(lines[1], "[]byte(")
		if lines[0] != "go test fuzz v1" || !ok {
			t.Fatalf("%s is not a FuzzParse corpus file", e.Name())
		}
		data, err := strconv.Unquote(strings.TrimSuffix(literal, ")"))
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		table, err := Parse([]byte(data), Options{})
		switch {
		case strings.HasPrefix(e.Name(), "valid-"):
			if err != nil {
				t.Errorf("%s: %v", e.Name(), err)
				continue
			}
			for _, r := range table.Routes {
				types[r.Target.Type] = true
			}
		case strings.HasPrefix(e.Name(), "broken-"):
			if err == nil {
				t.Errorf("%s parses", e.Name())
			}
		}
	}
	for _, typ := range targetTypes() {
		if !types[typ] {
			t.Errorf("no valid seed has a %s target", typ)
		}
	}
}
