package testkit_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/outboxkit/dispatcher"

// harnessRoot is the fenced tree; every package below it is harness.
const harnessRoot = module + "/shared/testkit"

// listedPackage is what this test reads of `go list -json`.
type listedPackage struct {
	ImportPath string
	Standard   bool
	Imports    []string // the package's own imports, its _test files' left out
	Deps       []string // everything it imports, directly or not, its _test files' left out
}

// goList runs `go list -json args...` in dir (relative to this package)
// and decodes its stream of packages.
func goList(t *testing.T, dir string, args ...string) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func inHarness(path string) bool {
	return path == harnessRoot || strings.HasPrefix(path, harnessRoot+"/")
}

// No product package imports the harness, directly or through another
// package: a test double, a fault injector or a soak linked into a Lambda
// function or the CLI would ship with it. Tests (_test files) may import
// the harness; go list leaves their imports out of Imports and Deps.
func TestNoProductPackageImportsTheHarness(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..") // shared/testkit → the module's root
	pkgs := goList(t, root, "./...")
	product := 0
	for _, p := range pkgs {
		if inHarness(p.ImportPath) {
			continue
		}
		product++
		for _, dep := range p.Deps {
			if inHarness(dep) {
				t.Errorf("product package %s imports the harness package %s (directly or through another package): only tests and shared/testkit may", p.ImportPath, dep)
			}
		}
	}
	// The listing itself must have worked: the module has dozens of
	// product packages, among them the functions and the CLI.
	if product < 30 || !slices.ContainsFunc(pkgs, func(p listedPackage) bool { return p.ImportPath == module+"/functions/dispatch" }) {
		t.Fatalf("go list found %d product packages, without functions/dispatch: the scan is broken", product)
	}
}

// The producer module (shared/outbox) is what producer services link: its
// packages import the standard library, pgx and uuid, and nothing else —
// above all nothing of the dispatcher module.
func TestTheProducerModuleImportsOnlyTheStandardLibraryPgxAndUUID(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "outbox")
	own := module + "/shared/outbox"
	allowed := func(path string) bool {
		return path == own || strings.HasPrefix(path, own+"/") ||
			path == "github.com/google/uuid" ||
			path == "github.com/jackc/pgx/v5" || strings.HasPrefix(path, "github.com/jackc/pgx/v5/")
	}
	pkgs := goList(t, dir, "-deps", "./...")
	standard := map[string]bool{}
	for _, p := range pkgs {
		standard[p.ImportPath] = p.Standard
	}
	checked := 0
	for _, p := range pkgs {
		if p.ImportPath != own && !strings.HasPrefix(p.ImportPath, own+"/") {
			continue // a dependency: its own imports are its business
		}
		checked++
		for _, imp := range p.Imports {
			if !standard[imp] && !allowed(imp) {
				t.Errorf("the producer module's %s imports %s: producers may link only the standard library, pgx and uuid", p.ImportPath, imp)
			}
		}
	}
	if checked == 0 {
		t.Fatal("go list found no package of the producer module: the scan is broken")
	}
}
