package infra_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

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
