package main

import (
	"debug/buildinfo"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The binary says which commit it was built from, so that an operator can
// tell which outboxctl produced a report.
func TestVersionNamesTheRevision(t *testing.T) {
	t.Parallel()
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout (git rev-parse HEAD: %v): the VCS revision cannot be stamped nor checked", err)
	}
	bin := filepath.Join(t.TempDir(), "outboxctl")
	// -buildvcs=true overrides a GOFLAGS=-buildvcs=false, as a release
	// build would.
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-buildvcs=true", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	outputOf := func(args ...string) string {
		out, err := exec.Command(bin, args...).Output()
		if err != nil {
			t.Fatalf("outboxctl %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	// What the toolchain recorded in the binary is the truth outboxctl
	// must tell. Go does not stamp a git worktree's checkout (its .git is
	// a file), so a build there has no revision, and must claim none.
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var stamped string
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			stamped = s.Value
		}
	}
	revision := strings.TrimSpace(string(head))
	version := info.Main.Version
	line := outputOf("version")
	switch {
	case stamped == "":
		t.Logf("the toolchain stamped no VCS revision here (a git worktree?): checking that none is claimed")
		if want := "outboxctl " + version + ", " + runtime.Version() + "\n"; line != want {
			t.Errorf("outboxctl version = %q, want %q", line, want)
		}
		revision = ""
	case stamped != revision:
		t.Fatalf("the binary was stamped with %s, git says HEAD is %s", stamped, revision)
	case !strings.HasPrefix(line, "outboxctl "+version+" revision "+revision) || !strings.Contains(line, runtime.Version()):
		t.Errorf("outboxctl version = %q, want the module version %s, revision %s and %s", line, version, revision, runtime.Version())
	}
	if flag := outputOf("--version"); flag != line {
		t.Errorf("outboxctl --version = %q, outboxctl version = %q: want the same line", flag, line)
	}
	var v buildVersion
	if err := json.Unmarshal([]byte(outputOf("version", "--json")), &v); err != nil || v.Revision != revision || v.Module != "github.com/outboxkit/dispatcher" {
		t.Errorf("outboxctl version --json: %+v (%v), want revision %s of github.com/outboxkit/dispatcher", v, err, revision)
	}
}
