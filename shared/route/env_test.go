package route

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// env is a fake environment.
type env map[string]string

func (e env) get(name string) string { return e[name] }

func noFile(path string) ([]byte, error) {
	panic("readFile called for " + path)
}

func TestFromEnv(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "routes.json")
	yamlPath := filepath.Join(dir, "routes.yml")
	badPath := filepath.Join(dir, "bad.yaml")
	for path, src := range map[string]string{jsonPath: "testdata/example.json", yamlPath: "testdata/example.yaml"} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(badPath, []byte("routes:\n  - match: {namespace: a, topic: b}\n    target: {type: sqs}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	inline, err := os.ReadFile("testdata/example.json")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("OUTBOX_ROUTES", func(t *testing.T) {
		t.Parallel()
		table, err := FromEnv(env{"OUTBOX_ROUTES": string(inline)}.get, noFile, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(table.Routes) != 4 || table.Match("payments", "charge").Target.Type != "sns" {
			t.Errorf("unexpected table:\n%s", describeTable(table))
		}
	})
	for _, path := range []string{jsonPath, yamlPath} {
		t.Run("OUTBOX_ROUTES_FILE "+filepath.Ext(path), func(t *testing.T) {
			t.Parallel()
			table, err := FromEnv(env{"OUTBOX_ROUTES_FILE": path}.get, os.ReadFile, Options{})
			if err != nil {
				t.Fatal(err)
			}
			want, err := FromEnv(env{"OUTBOX_ROUTES": string(inline)}.get, noFile, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if a, b := describeTable(table), describeTable(want); a != b {
				t.Errorf("file table differs from OUTBOX_ROUTES's:\n%s\n%s", a, b)
			}
		})
	}
	t.Run("both", func(t *testing.T) {
		t.Parallel()
		_, err := FromEnv(env{"OUTBOX_ROUTES": string(inline), "OUTBOX_ROUTES_FILE": jsonPath}.get, noFile, Options{})
		if err == nil || !strings.Contains(err.Error(), "both OUTBOX_ROUTES and OUTBOX_ROUTES_FILE are set; set exactly one") {
			t.Fatalf("err = %v, want one naming both variables", err)
		}
	})
	t.Run("neither", func(t *testing.T) {
		t.Parallel()
		_, err := FromEnv(env{"OUTBOX_ROUTE": "typo"}.get, noFile, Options{})
		if !errors.Is(err, ErrNotConfigured) {
			t.Fatalf("err = %v, want ErrNotConfigured", err)
		}
		if !strings.Contains(err.Error(), "set OUTBOX_ROUTES (the configuration as JSON) or OUTBOX_ROUTES_FILE (the path of a JSON or YAML file)") {
			t.Errorf("err = %v, want one naming both variables", err)
		}
	})
	t.Run("unreadable file", func(t *testing.T) {
		t.Parallel()
		missing := filepath.Join(dir, "missing.yaml")
		_, err := FromEnv(env{"OUTBOX_ROUTES_FILE": missing}.get, os.ReadFile, Options{})
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("err = %v, want one wrapping fs.ErrNotExist", err)
		}
		if want := `route: OUTBOX_ROUTES_FILE: reading "` + missing + `"`; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("err = %v, want it to start with %s", err, want)
		}
	})
	t.Run("invalid file", func(t *testing.T) {
		t.Parallel()
		_, err := FromEnv(env{"OUTBOX_ROUTES_FILE": badPath}.get, os.ReadFile, Options{})
		ce, ok := errors.AsType[*ConfigError](err)
		if !ok {
			t.Fatalf("err = %v, want a *ConfigError", err)
		}
		wantFirst := `route: invalid configuration in OUTBOX_ROUTES_FILE "` + badPath + `" (1 problem):`
		if first, _, _ := strings.Cut(err.Error(), "\n"); first != wantFirst {
			t.Errorf("first line %q, want %q", first, wantFirst)
		}
		if len(ce.Problems) != 1 || ce.Problems[0].Field != "routes[0].target.type" {
			t.Errorf("problems = %v", ce.Problems)
		}
	})
	t.Run("invalid OUTBOX_ROUTES", func(t *testing.T) {
		t.Parallel()
		_, err := FromEnv(env{"OUTBOX_ROUTES": `{"routes": []}`}.get, noFile, Options{})
		want := "route: invalid configuration in OUTBOX_ROUTES (1 problem):\nroutes: is empty: list at least one route"
		if err == nil || err.Error() != want {
			t.Errorf("err = %v\nwant %s", err, want)
		}
	})
}
