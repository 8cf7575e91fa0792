package infra_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// markdownLink is an inline link or image: [text](target) or
// [text](target "title").
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// Every relative link in README.md and docs/*.md points at a file or
// directory of the repository, and its #anchor, if any, at a heading of the
// Markdown file: a link that 404s on GitHub is a broken promise to the
// reader.
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
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(target, "#")
			path := filepath.Join(filepath.Dir(file), filepath.FromSlash(target))
			if target == "" {
				path = file
			}
			checked++
			rel, _ := filepath.Rel(root, file)
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", rel, m[1])
				continue
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !slices.Contains(headingAnchors(t, path), anchor) {
				t.Errorf("%s links to %s, but no heading there has the anchor #%s", rel, m[1], anchor)
			}
		}
	}
	if checked < 5 {
		t.Fatalf("found only %d relative links: the scan is broken", checked)
	}
}

// readmeLimit is the README's budget: a front door a newcomer reads in
// minutes; the reference lives in docs/.
const readmeLimit = 15 * 1024

func TestReadmeStaysAFrontDoor(t *testing.T) {
	t.Parallel()
	info, err := os.Stat(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Size() > readmeLimit {
		t.Errorf("README.md is %d bytes, over its budget of %d: move reference into docs/ and link to it", info.Size(), readmeLimit)
	}
}

// headingAnchors lists the anchors GitHub gives the headings of a Markdown
// file: lower case, punctuation dropped but for - and _, spaces as -.
func headingAnchors(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw = regexp.MustCompile("(?s)```.*?```").ReplaceAll(raw, nil)
	var anchors []string
	for _, m := range regexp.MustCompile(`(?m)^#+ (.*)$`).FindAllSubmatch(raw, -1) {
		h := strings.ToLower(strings.TrimSpace(string(m[1])))
		h = strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return r
			}
			return -1
		}, h)
		anchors = append(anchors, h)
	}
	return anchors
}
