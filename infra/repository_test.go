package infra_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTrackedFileBytes is the largest file the repository may track: every
// clone carries every version of every tracked file for good, so a build
// output or a data dump committed by mistake weighs on every user.
const maxTrackedFileBytes = 1 << 20

// No tracked file is over 1 MB: build outputs belong in .gitignore, not in
// the history every clone downloads.
func TestNoTrackedFileIsOverOneMegabyte(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not on the PATH: the tracked files cannot be listed")
	}
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skipf("not a git checkout (%v): no tracked files to check", err)
	}
	large, err := trackedFilesOver(root, maxTrackedFileBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(large) > 0 {
		t.Errorf("%d tracked file(s) over %d bytes (untrack with git rm --cached and list in .gitignore):\n  %s",
			len(large), maxTrackedFileBytes, strings.Join(large, "\n  "))
	}
}

// The check itself finds a large file once it is tracked, so that the test
// above cannot pass because it looks at nothing.
func TestTrackedFilesOverFindsALargeFile(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not on the PATH")
	}
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	git("init", "-q")
	if err := os.WriteFile(filepath.Join(dir, "small.txt"), []byte("small"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "big.bin"), bytes.Repeat([]byte{1}, maxTrackedFileBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	// Untracked, and large: not the check's business.
	if err := os.WriteFile(filepath.Join(dir, "untracked.bin"), bytes.Repeat([]byte{1}, 2*maxTrackedFileBytes), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", "small.txt", "sub/big.bin")
	large, err := trackedFilesOver(dir, maxTrackedFileBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(large) != 1 || !strings.HasPrefix(large[0], "sub/big.bin ") {
		t.Errorf("trackedFilesOver = %q, want sub/big.bin alone", large)
	}
}

// trackedFilesOver lists the files git tracks in root's index whose blob
// is over limit bytes, each as "path (size)". The index's sizes are read,
// not the work tree's, so that a file untracked with git rm --cached but
// still on disk no longer counts.
func trackedFilesOver(root string, limit int64) ([]string, error) {
	// %(objectsize) is the blob's size; --format needs git 2.36+, so
	// the stage line (mode, object, stage, path) is read instead and
	// the sizes asked of git cat-file in one batch.
	cmd := exec.Command("git", "ls-files", "-s", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", root, err)
	}
	var objects, paths []string
	for _, entry := range strings.Split(string(out), "\x00") {
		meta, path, ok := strings.Cut(entry, "\t")
		fields := strings.Fields(meta)
		if !ok || len(fields) != 3 || fields[0] == "160000" { // 160000: a submodule, no blob here
			continue
		}
		objects, paths = append(objects, fields[1]), append(paths, path)
	}
	if len(objects) == 0 {
		return nil, nil
	}
	batch := exec.Command("git", "cat-file", "--batch-check=%(objectsize)")
	batch.Dir = root
	batch.Stdin = strings.NewReader(strings.Join(objects, "\n") + "\n")
	sizes, err := batch.Output()
	if err != nil {
		return nil, fmt.Errorf("git cat-file --batch-check in %s: %w", root, err)
	}
	lines := strings.Fields(string(sizes))
	if len(lines) != len(objects) {
		return nil, fmt.Errorf("git cat-file gave %d sizes for %d files", len(lines), len(objects))
	}
	var large []string
	for i, line := range lines {
		var size int64
		if _, err := fmt.Sscan(line, &size); err != nil {
			return nil, fmt.Errorf("git cat-file: size %q of %s: %w", line, paths[i], err)
		}
		if size > limit {
			large = append(large, fmt.Sprintf("%s (%.1f MB)", paths[i], float64(size)/(1<<20)))
		}
	}
	return large, nil
}
