package config_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// readmeBlock returns the text between <!-- name:begin --> and
// <!-- name:end --> in docs/CONFIGURATION.md.
func referenceBlock(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/CONFIGURATION.md")
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- "+name+":begin -->\n", "<!-- "+name+":end -->"
	i := strings.Index(string(raw), begin)
	j := strings.Index(string(raw), end)
	if i < 0 || j < i {
		t.Fatalf("docs/CONFIGURATION.md has no %s block", name)
	}
	return string(raw)[i+len(begin) : j]
}

func TestConfigurationReferenceMatchesTheRegistry(t *testing.T) {
	t.Parallel()
	want := config.MarkdownReference()
	if got := referenceBlock(t, "settings"); got != want {
		t.Errorf("docs/CONFIGURATION.md's settings reference is out of date; between the settings markers it should read:\n\n%s", want)
	}
}

// readers are the packages that read the product's variables: this one,
// and its part for the dispatch function.
var readers = []string{"shared/config", "shared/config/dispatchconfig"}

// The test harness reads its own OUTBOX_TEST_* variables (shared/testkit/pgtest)
// and sets the functions' variables for the processes it launches; it is
// the only other place where a Go string may start with OUTBOX_.
var harness = []string{"shared/testkit"}

// inHarness reports whether pkg is one of the harness packages or below one.
func inHarness(pkg string) bool {
	return slices.ContainsFunc(harness, func(h string) bool { return pkg == h || strings.HasPrefix(pkg, h+"/") })
}

// testVariables are the harness's own: read by shared/testkit/pgtest alone.
const testVariables, testReader = "OUTBOX_TEST_", "shared/testkit/pgtest"

// outboxLiteral is a Go string naming an OUTBOX_* variable: the name alone
// (what a read passes to getenv), or NAME=value (a variable set for a
// launched process).
var outboxLiteral = regexp.MustCompile(`^(OUTBOX_[A-Z0-9_]+)(=.*)?$`)

// literal is one OUTBOX_* string in the module's non-test code.
type literal struct {
	file, pkg, pos, name string
	assignment           bool
}

// registry is the file that documents the variables: it names them all
// and reads none.
const registry = "shared/config/registry.go"

// moduleLiterals parses every non-test Go file of the module (the bench
// module is its own, a harness too) and returns its strings that start
// with OUTBOX_.
func moduleLiterals(t *testing.T) []literal {
	t.Helper()
	const root = "../.."
	var out []literal
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "bench" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil || !strings.HasPrefix(s, "OUTBOX_") {
				return true
			}
			l := literal{file: rel, pkg: filepath.ToSlash(filepath.Dir(rel)), pos: fset.Position(lit.Pos()).String()}
			if m := outboxLiteral.FindStringSubmatch(s); m != nil {
				l.name, l.assignment = m[1], m[2] != ""
			}
			out = append(out, l)
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Every OUTBOX_* variable is read in exactly one package: the functions'
// and the CLI's in this one or, the dispatch function's own, in
// dispatchconfig; the test harness's in shared/testkit/pgtest. Every name in the
// code is registered (and so documented).
func TestEveryVariableIsReadInExactlyOnePackage(t *testing.T) {
	t.Parallel()
	literals := moduleLiterals(t)
	if len(literals) < 40 {
		t.Fatalf("found only %d OUTBOX_* strings: the scan is broken", len(literals))
	}
	readBy := map[string]map[string]bool{} // variable → the packages that name it alone
	for _, l := range literals {
		harnessCode, inReaders := inHarness(l.pkg), slices.Contains(readers, l.pkg)
		switch {
		case l.name == "":
			if !inReaders && !harnessCode {
				t.Errorf("%s: a string starting with OUTBOX_ that names no variable; the environment is read in shared/config", l.pos)
			}
			continue
		case !inReaders && !harnessCode:
			t.Errorf("%s: %s is named outside shared/config; read it there and hand the component a typed value", l.pos, l.name)
		case harnessCode && !l.assignment && (!strings.HasPrefix(l.name, testVariables) || l.pkg != testReader):
			t.Errorf("%s: the harness reads %s; only %s reads variables, its own %s*", l.pos, l.name, testReader, testVariables)
		}
		if _, ok := config.Lookup(l.name); !ok {
			t.Errorf("%s: %s is not registered in config.Variables", l.pos, l.name)
		}
		if !l.assignment && l.file != registry {
			if readBy[l.name] == nil {
				readBy[l.name] = map[string]bool{}
			}
			readBy[l.name][l.pkg] = true
		}
	}
	for _, v := range config.Variables {
		want := readers
		if strings.HasPrefix(v.Name, testVariables) {
			want = []string{testReader}
		}
		if got := sortedKeys(readBy[v.Name]); len(got) != 1 || !slices.Contains(want, got[0]) {
			t.Errorf("%s is read in %v, want in exactly one of %v", v.Name, got, want)
		}
	}
}

// Every registered variable is read when the configurations are loaded:
// none is documented and forgotten.
func TestEveryRegisteredVariableIsRead(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	read := map[string]bool{}
	env := config.Env{Getenv: func(name string) string {
		mu.Lock()
		defer mu.Unlock()
		read[name] = true
		return ""
	}}
	_, _ = dispatchconfig.LoadServe(env, true)
	_, _ = config.LoadReplay(env)
	_, _ = config.LoadMetrics(env)
	_ = config.SinkSecret(env)
	for _, v := range config.Variables {
		if !strings.HasPrefix(v.Name, testVariables) && !read[v.Name] {
			t.Errorf("%s is registered but no configuration reads it", v.Name)
		}
	}
}

// The registry documents the harness's default server, which shared/testkit/pgtest
// (which the product must not import) declares.
func TestTheTestServerDefaultIsPgtests(t *testing.T) {
	t.Parallel()
	if v, _ := config.Lookup("OUTBOX_TEST_DATABASE_URL"); v.Default != pgtest.DefaultURL {
		t.Errorf("the registry documents %q, pgtest uses %q", v.Default, pgtest.DefaultURL)
	}
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
