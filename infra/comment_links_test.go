package infra_test

import (
	"bytes"
	"fmt"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// repoPath is a path into the repository as a comment writes it: a top
// directory of the repository followed by at least one element
// (shared/lease, migrations/functions/claim_batch.sql, docs/DATABASE.md,
// cmd/outboxctl). It must not follow a letter, digit, slash or dot, so that
// import paths (github.com/…/shared/lease), relative paths (./cmd/floor) and
// words such as "SQL functions/tables" are not taken for one.
var repoPath = regexp.MustCompile(`(?:^|[^A-Za-z0-9_/.\-])((?:shared|cmd|migrations|docs|infra|bench|events)/[A-Za-z0-9_.\-/]*[A-Za-z0-9_])`)

// outsideNames are what would send a reader out of the repository: a
// sibling checkout, design notes and style guides that are not shipped,
// and section signs that cite them.
var outsideNames = regexp.MustCompile(`\.\./shared/|\b(?:DESIGN|STYLE)\.md\b|§`)

// migrationNumber is a versioned migration named by its number
// ("migration" and its number); "pre-release migration N" names one
// the baseline squashed, which is history, not a file.
var migrationNumber = regexp.MustCompile(`(pre-release )?\bmigration 0*([0-9]+)\b`)

// placeholder paths are patterns, not files: migrations/000NN_name.sql,
// shared/xyz.
var placeholder = regexp.MustCompile(`000NN|\bxyz\b`)

// exists reports whether p names a file or directory under base, or a
// declaration of a package there (shared/testkit/pgtest.RoundTrips).
func exists(base, p string) bool {
	if _, err := os.Stat(filepath.Join(base, filepath.FromSlash(p))); err == nil {
		return true
	}
	dir, name := path.Split(p)
	pkg, ident, ok := strings.Cut(name, ".")
	if !ok || ident == "" || strings.ContainsAny(ident[:1], "abcdefghijklmnopqrstuvwxyz") {
		return false
	}
	info, err := os.Stat(filepath.Join(base, filepath.FromSlash(dir+pkg)))
	return err == nil && info.IsDir()
}

// comments returns the comments of a Go or SQL file, each with its line.
func comments(t *testing.T, path string, src []byte) map[int]string {
	t.Helper()
	out := map[int]string{}
	switch filepath.Ext(path) {
	case ".go":
		fset := token.NewFileSet()
		file := fset.AddFile(path, -1, len(src))
		var s scanner.Scanner
		s.Init(file, src, nil, scanner.ScanComments)
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			if tok != token.COMMENT {
				continue
			}
			line := fset.Position(pos).Line
			for i, l := range strings.Split(lit, "\n") {
				out[line+i] = l
			}
		}
	case ".sql":
		for i, l := range strings.Split(string(src), "\n") {
			if _, c, ok := strings.Cut(l, "--"); ok {
				out[i+1] = c
			}
		}
	}
	return out
}

// Every repository path a comment of Go or SQL names exists (a file, a
// package or a directory), and no comment names a file outside the
// repository: a reader who follows a comment must land somewhere.
// Comments in the bench module may name its paths from its own root.
func TestCommentsNameOnlyWhatTheRepositoryHas(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(path); ext != ".go" && ext != ".sql" {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		bases := []string{root}
		if strings.HasPrefix(rel, "bench/") {
			bases = append(bases, filepath.Join(root, "bench"))
		}
		for line, text := range comments(t, path, src) {
			if m := outsideNames.FindString(text); m != "" {
				t.Errorf("%s:%d names %q, which is not in the repository: say it here or in docs/", rel, line, m)
			}
			for _, m := range migrationNumber.FindAllStringSubmatch(text, -1) {
				if m[1] != "" {
					continue
				}
				checked++
				n, _ := strconv.Atoi(m[2])
				if files, _ := filepath.Glob(filepath.Join(root, "migrations", fmt.Sprintf("%05d_*.sql", n))); len(files) == 0 {
					t.Errorf("%s:%d names migration %s, which migrations/ does not have", rel, line, m[2])
				}
			}
			for _, m := range repoPath.FindAllStringSubmatch(text, -1) {
				p := strings.TrimRight(m[1], ".-_/")
				checked++
				found := false
				for _, base := range bases {
					if exists(base, p) {
						found = true
						break
					}
				}
				if !found && !placeholder.MatchString(p) {
					t.Errorf("%s:%d names %s, which does not exist", rel, line, p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("found only %d repository paths in comments: the scan is broken", checked)
	}
}

// The docs, too, send no reader outside the repository.
func TestDocsNameNothingOutsideTheRepository(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range append(docs, filepath.Join("..", "README.md")) {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range bytes.Split(raw, []byte("\n")) {
			// A link's target is checked by
			// TestRelativeLinksInTheDocsPointAtFiles, relative to the
			// document: a parent-relative link from docs/ stays inside.
			line = markdownLink.ReplaceAll(line, []byte("]()"))
			if m := outsideNames.Find(line); m != nil {
				t.Errorf("%s:%d names %q, which is not in the repository", file, i+1, m)
			}
		}
	}
}
