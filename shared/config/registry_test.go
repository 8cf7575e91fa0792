package config_test

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/config"
)

// readmeBlock returns the text between <!-- name:begin --> and
// <!-- name:end --> in the README.
func readmeBlock(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- "+name+":begin -->\n", "<!-- "+name+":end -->"
	i := strings.Index(string(raw), begin)
	j := strings.Index(string(raw), end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %s block", name)
	}
	return string(raw)[i+len(begin) : j]
}

func TestREADMEConfigurationReferenceMatchesTheRegistry(t *testing.T) {
	t.Parallel()
	want := config.MarkdownReference()
	if got := readmeBlock(t, "settings"); got != want {
		t.Errorf("README.md's configuration reference is out of date; between the settings markers it should read:\n\n%s", want)
	}
}

// Every OUTBOX_* variable the code reads is registered (and so documented).
func TestEveryVariableInTheCodeIsRegistered(t *testing.T) {
	t.Parallel()
	name := regexp.MustCompile(`"(OUTBOX_[A-Z0-9_]+)"`)
	found := map[string]string{}
	for _, root := range []string{"../../shared", "../../functions", "../../cmd", "../../migrations"} {
		filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			src, _ := os.ReadFile(path)
			for _, m := range name.FindAllStringSubmatch(string(src), -1) {
				found[m[1]] = path
			}
			return nil
		})
	}
	if len(found) < 20 {
		t.Fatalf("found only %d variables: the scan is broken", len(found))
	}
	var missing []string
	for v, path := range found {
		if _, ok := config.Lookup(v); !ok {
			missing = append(missing, v+" (read in "+path+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("%s is not registered in config.Variables", m)
	}
}
