package infra_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// goPackages lists the import paths of dir's module, relative to the
// repository root (root).
func goPackages(t *testing.T, root, dir string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = filepath.Join(root, dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", cmd.Dir, err, stderr.String())
	}
	var paths []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct{ Dir string }
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, filepath.ToSlash(rel))
	}
	return paths
}

// layoutEntries reads the first code block of docs/LAYOUT.md: the first
// field of every line that is not blank or a # heading.
func layoutEntries(t *testing.T, layout []byte) []string {
	t.Helper()
	_, block, ok := bytes.Cut(layout, []byte("```\n"))
	if !ok {
		t.Fatal("docs/LAYOUT.md has no code block")
	}
	block, _, _ = bytes.Cut(block, []byte("```"))
	var entries []string
	sc := bufio.NewScanner(bytes.NewReader(block))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		entries = append(entries, strings.Fields(line)[0])
	}
	return entries
}

// docs/LAYOUT.md lists every Go package of the root module and of the
// producer module (shared/outbox), one line each, and nothing that is
// gone: a newcomer reads the map there, so a package added or removed
// without it fails here.
func TestLayoutListsEveryPackage(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	layout, err := os.ReadFile(filepath.Join(root, "docs", "LAYOUT.md"))
	if err != nil {
		t.Fatal(err)
	}
	entries := layoutEntries(t, layout)
	packages := append(goPackages(t, root, "."), goPackages(t, root, "shared/outbox")...)
	if len(packages) < 40 {
		t.Fatalf("go list found %d packages: the scan is broken", len(packages))
	}
	for _, p := range packages {
		if !slices.Contains(entries, p) {
			t.Errorf("package %s is missing from docs/LAYOUT.md", p)
		}
	}
	for _, e := range entries {
		if slices.Contains(packages, e) {
			continue
		}
		// Not a package: a directory or a file of the repository (events/,
		// template.yaml), which must exist and hold no Go package.
		path := filepath.Join(root, strings.TrimSuffix(e, "/"))
		info, err := os.Stat(path)
		if err != nil {
			t.Errorf("docs/LAYOUT.md lists %s, which does not exist", e)
			continue
		}
		if !info.IsDir() || strings.HasSuffix(e, "/") {
			continue
		}
		if gofiles, _ := filepath.Glob(filepath.Join(path, "*.go")); len(gofiles) > 0 {
			t.Errorf("docs/LAYOUT.md lists %s, which is no package of either module", e)
		} else {
			t.Errorf("docs/LAYOUT.md lists %s as a package, but it holds none (a directory is written %s/)", e, e)
		}
	}
}
