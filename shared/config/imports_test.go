package config_test

import (
	"go/build"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The reaper, replay and metrics functions read their configuration with
// this package but must not link the routes (and their JSON Schema
// library, whose initialisation every cold start would pay), nor the
// dispatch engine: the dispatch function's configuration is apart, in
// dispatchconfig.
func TestTheOtherFunctionsDoNotLinkTheRoutes(t *testing.T) {
	t.Parallel()
	const module = "github.com/outboxkit/dispatcher/"
	for _, fn := range []string{"reaper", "dlq-replay", "metrics", "migrate"} {
		seen := map[string]bool{}
		var walk func(dir string, path []string)
		walk = func(dir string, path []string) {
			pkg, err := build.ImportDir(dir, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range pkg.Imports {
				rel, ok := strings.CutPrefix(imp, module)
				if !ok || seen[rel] {
					continue
				}
				seen[rel] = true
				if slices.Contains([]string{"shared/route", "shared/dispatch"}, rel) {
					t.Errorf("functions/%s links %s: %s", fn, rel, strings.Join(append(path, rel), " → "))
				}
				walk(filepath.Join("../..", rel), append(path, rel))
			}
		}
		walk(filepath.Join("../../functions", fn), []string{"functions/" + fn})
		if !seen["shared/config"] {
			t.Fatalf("functions/%s does not import shared/config: the walk is broken", fn)
		}
	}
}
