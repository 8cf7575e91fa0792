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
	"regexp"
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

// layoutEntries reads the code block under README's "## Layout": the
// first field of every line that is not blank or a # heading.
func layoutEntries(t *testing.T, readme []byte) []string {
	t.Helper()
	_, section, ok := bytes.Cut(readme, []byte("\n## Layout\n"))
	if !ok {
		t.Fatal(`README.md has no "## Layout" section`)
	}
	_, block, ok := bytes.Cut(section, []byte("```\n"))
	if !ok {
		t.Fatal("README.md's Layout section has no code block")
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

// README's layout lists every Go package of the root module and of the
// producer module (shared/outbox), one line each, and nothing that is
// gone: a newcomer reads the map there, so a package added or removed
// without it fails here.
func TestReadmeLayoutListsEveryPackage(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	entries := layoutEntries(t, readme)
	packages := append(goPackages(t, root, "."), goPackages(t, root, "shared/outbox")...)
	if len(packages) < 40 {
		t.Fatalf("go list found %d packages: the scan is broken", len(packages))
	}
	for _, p := range packages {
		if !slices.Contains(entries, p) {
			t.Errorf("package %s is missing from README.md's Layout section", p)
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
			t.Errorf("README.md's Layout lists %s, which does not exist", e)
			continue
		}
		if !info.IsDir() || strings.HasSuffix(e, "/") {
			continue
		}
		if gofiles, _ := filepath.Glob(filepath.Join(path, "*.go")); len(gofiles) > 0 {
			t.Errorf("README.md's Layout lists %s, which is no package of either module", e)
		} else {
			t.Errorf("README.md's Layout lists %s as a package, but it holds none (a directory is written %s/)", e, e)
		}
	}
}

// markdownLink is an inline link or image: [text](target) or
// [text](target "title").
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// Every relative link in README.md and docs/*.md points at a file or
// directory of the repository: a link that 404s on GitHub is a broken
// promise to the reader.
func TestRelativeLinksInTheDocsPointAtFiles(t *testing.T) {
	t.Parallel()
	root := ".."
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := append([]string{filepath.Join(root, "README.md")}, docs...)
	checked := 0
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		// Code spans and blocks are not links.
		text = regexp.MustCompile("(?s)```.*?```").ReplaceAll(text, nil)
		text = regexp.MustCompile("`[^`\n]*`").ReplaceAll(text, nil)
		for _, m := range markdownLink.FindAllSubmatch(text, -1) {
			target := string(m[1])
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			checked++
			if _, err := os.Stat(filepath.Join(filepath.Dir(file), filepath.FromSlash(target))); err != nil {
				rel, _ := filepath.Rel(root, file)
				t.Errorf("%s links to %s, which does not exist", rel, m[1])
			}
		}
	}
	if checked < 5 {
		t.Fatalf("found only %d relative links: the scan is broken", checked)
	}
}
