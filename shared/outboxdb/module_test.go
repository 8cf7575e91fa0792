package outboxdb_test

import (
	"encoding/json"
	"errors"
	"go/version"
	"os"
	"os/exec"
	"testing"
)

// producerModuleDir is the producer API's own module, shared/outbox.
const producerModuleDir = "../outbox"

// What a producer service's build may get from the producer module: pgx,
// the UUID type of Enqueued.ID, and what pgx itself imports. Anything more
// (the AWS SDK, goose, cobra, a module of this repository) is the
// dispatcher's, and would be linked into every producer.
var producerRequirements = map[string]bool{
	"github.com/jackc/pgx/v5":        true,
	"github.com/google/uuid":         true,
	"github.com/jackc/pgpassfile":    true,
	"github.com/jackc/pgservicefile": true,
	"golang.org/x/text":              true,
}

func TestProducerModuleRequiresOnlyPgx(t *testing.T) {
	t.Parallel()
	var mod struct {
		Go      string
		Require []struct {
			Path, Version string
			Indirect      bool
		}
		Replace []struct{ Old struct{ Path string } }
	}
	goCommand(t, &mod, "mod", "edit", "-json")
	for _, r := range mod.Require {
		if !producerRequirements[r.Path] {
			t.Errorf("shared/outbox/go.mod requires %s %s: a producer service would build it too; the producer module may require only pgx, github.com/google/uuid and what pgx imports", r.Path, r.Version)
		}
	}
	// A replace directive applies to this repository only: producers would
	// build what the module requires, not what its tests ran against.
	for _, r := range mod.Replace {
		t.Errorf("shared/outbox/go.mod replaces %s: producers would not see the replacement", r.Old.Path)
	}

	// Its go directive is the oldest Go the module can be built with:
	// pgx's, unless the code itself needs a newer one.
	var pgx struct{ Version, GoVersion string }
	goCommand(t, &pgx, "list", "-m", "-json", "github.com/jackc/pgx/v5")
	if pgx.GoVersion == "" {
		t.Fatalf("go list -m found no go directive for pgx %s", pgx.Version)
	}
	if version.Compare("go"+mod.Go, "go"+pgx.GoVersion) > 0 {
		t.Errorf("shared/outbox/go.mod says go %s, newer than the go %s pgx %s requires: producers on an older Go could not build it; lower it unless the code needs it",
			mod.Go, pgx.GoVersion, pgx.Version)
	}
}

// goCommand runs the go command in the producer module, without changing
// its go.mod, and decodes its JSON output into v.
func goCommand(t *testing.T, v any, args ...string) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = producerModuleDir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("go %v in %s: %v\n%s", args, producerModuleDir, err, exit.Stderr)
		}
		t.Fatalf("go %v in %s: %v", args, producerModuleDir, err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("go %v: decode its output: %v", args, err)
	}
}
