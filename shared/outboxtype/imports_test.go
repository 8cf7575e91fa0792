package outboxtype_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/outboxkit/dispatcher"

// deps lists what the packages matching pattern link (go list -deps: the
// transitive imports, tests excluded), as "path=standard" words.
func deps(t *testing.T, pattern string) map[string][]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to read the import graph: %v", err)
	}
	out := map[string][]string{}
	for _, root := range list(t, goTool, "-f", "{{.ImportPath}}", pattern) {
		out[root] = list(t, goTool, "-deps", "-f", "{{.ImportPath}} {{.Standard}}", root)
	}
	if len(out) == 0 {
		t.Fatalf("no package matches %s", pattern)
	}
	return out
}

func list(t *testing.T, goTool string, args ...string) []string {
	t.Helper()
	raw, err := exec.Command(goTool, append([]string{"list"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(strings.ReplaceAll(string(raw), " ", "="))
}

// The leaf imports the standard library and uuid, nothing else: every layer
// may import it without linking another.
func TestLeafImportsNothingOfTheModule(t *testing.T) {
	t.Parallel()
	for _, line := range deps(t, module+"/shared/outboxtype")[module+"/shared/outboxtype"] {
		path, standard, _ := strings.Cut(line, "=")
		switch {
		case path == module+"/shared/outboxtype", standard == "true", path == "github.com/google/uuid":
		default:
			t.Errorf("shared/outboxtype links %s: it must stay a leaf (the standard library and uuid only)", path)
		}
	}
}

// Publishers speak of messages through the leaf: none links the database
// store, nor a database driver. Neither does the receivers' library, whose
// own PostgreSQL deduper uses pgx but not the dispatcher's store. That
// includes shared/publish/publishers, the cold start's builder of them: it
// reads the route table, which knows the database's default attempt
// ceiling from the leaf.
func TestPublishersDoNotLinkTheStore(t *testing.T) {
	t.Parallel()
	for pattern, forbidden := range map[string][]string{
		module + "/shared/publish/...": {module + "/shared/lease", "github.com/jackc/pgx/"},
		module + "/shared/sink":        {module + "/shared/lease"},
	} {
		for root, linked := range deps(t, pattern) {
			for _, line := range linked {
				path, _, _ := strings.Cut(line, "=")
				for _, f := range forbidden {
					if path == f || strings.HasSuffix(f, "/") && strings.HasPrefix(path, f) {
						t.Errorf("%s links %s", strings.TrimPrefix(root, module+"/"), path)
					}
				}
			}
		}
	}
}
