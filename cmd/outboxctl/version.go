package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// buildVersion describes this binary from what the Go toolchain recorded
// in it: the module version (a tag for `go install …@v1.2.3`; for a build
// from a checkout a pseudo-version such as v0.0.0-20261125172512-33c64a10d854,
// or "(devel)" when the toolchain could not read the repository, as in a
// git worktree) and, for a build from a checkout, the VCS revision, its
// commit time and whether the tree had uncommitted changes.
type buildVersion struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
}

func readBuildVersion() buildVersion {
	v := buildVersion{Version: "unknown", Go: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Module = info.Main.Path
	if info.Main.Version != "" {
		v.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// String is the one line `outboxctl version` and --version print, e.g.
// "outboxctl v0.0.0-20261125172512-33c64a10d854 revision 33c64a10d854… (2026-11-25T17:25:12Z), go1.26.8".
func (v buildVersion) String() string {
	s := "outboxctl " + v.Version
	if v.Revision != "" {
		s += " revision " + v.Revision
		switch {
		case v.Time != "" && v.Modified:
			s += " (" + v.Time + ", modified)"
		case v.Time != "":
			s += " (" + v.Time + ")"
		case v.Modified:
			s += " (modified)"
		}
	}
	return s + ", " + v.Go
}

func newVersionCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version and VCS revision this outboxctl was built from",
		Long: `Print the module version and the VCS revision (commit, its time, and
"modified" when the tree had uncommitted changes) this binary was built
from, and the Go version that built it. A build from a checkout (make
outboxctl, go build) has a pseudo-version and its revision (go run, and a
build in a git worktree, have neither: "(devel)"); go install …@vX.Y.Z has
the tag. outboxctl --version prints the same line.`,
		Example: `  outboxctl version
  outboxctl version --json | jq -r .revision`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := readBuildVersion()
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), v)
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), v)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the build information as JSON")
	return cmd
}
