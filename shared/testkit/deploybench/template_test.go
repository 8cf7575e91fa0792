package deploybench_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxkit/dispatcher/shared/testkit/deploybench"
)

// The benchmark measures the deployment the template makes: its defaults
// must be the template's, or the figures describe another deployment.
func TestTemplateDefaultsMirrorTheTemplate(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tpl struct {
		Parameters map[string]struct {
			Default string `yaml:"Default"`
		} `yaml:"Parameters"`
		Globals struct {
			Function struct {
				MemorySize int `yaml:"MemorySize"`
			} `yaml:"Function"`
		} `yaml:"Globals"`
		Resources struct {
			DispatchFunction struct {
				Properties struct {
					EventInvokeConfig struct {
						MaximumEventAgeInSeconds int `yaml:"MaximumEventAgeInSeconds"`
					} `yaml:"EventInvokeConfig"`
				} `yaml:"Properties"`
			} `yaml:"DispatchFunction"`
		} `yaml:"Resources"`
	}
	// The intrinsics' tags (!Ref, !Sub) are not needed here: decode
	// through a node so that yaml does not refuse them.
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if err := doc.Decode(&tpl); err != nil {
		t.Fatal(err)
	}
	param := func(name string) string { return tpl.Parameters[name].Default }
	env := strings.Join(deploybench.TemplateEnv(deploybench.TemplateTimeout), "\n") + "\n"
	for _, c := range []struct{ what, template, mirror string }{
		{"DispatchSchedule", param("DispatchSchedule"), deploybench.TemplateSchedule},
		{"DispatchTimeout", param("DispatchTimeout"), fmt.Sprint(int(deploybench.TemplateTimeout / time.Second))},
		{"MemorySize", fmt.Sprint(tpl.Globals.Function.MemorySize), fmt.Sprint(deploybench.TemplateMemoryMB)},
		{"MaximumEventAgeInSeconds", fmt.Sprint(tpl.Resources.DispatchFunction.Properties.EventInvokeConfig.MaximumEventAgeInSeconds),
			fmt.Sprint(int(deploybench.TemplateMaximumEventAge / time.Second))},
	} {
		if c.template != c.mirror {
			t.Errorf("template %s is %q, deploybench uses %q", c.what, c.template, c.mirror)
		}
	}
	for variable, parameter := range map[string]string{
		"OUTBOX_BATCH_SIZE": "BatchSize", "OUTBOX_MAX_BATCHES": "MaxBatches", "OUTBOX_ORDERED_RUN": "OrderedRun",
		"OUTBOX_MAX_WORKERS": "DispatchMaxWorkers", "OUTBOX_LINGER": "DispatchLinger", "OUTBOX_LISTEN": "DispatchListen",
		"OUTBOX_POLL_INTERVAL": "DispatchPollInterval",
	} {
		if want := variable + "=" + param(parameter) + "\n"; !strings.Contains(env, want) {
			t.Errorf("deploybench's environment does not set %s: the template's %s default is %q", strings.TrimSpace(want), parameter, param(parameter))
		}
	}
	if want := fmt.Sprint(deploybench.TemplateMaxWorkers); param("DispatchMaxWorkers") != want {
		t.Errorf("DispatchMaxWorkers default %q, deploybench reserves %s", param("DispatchMaxWorkers"), want)
	}
}

// ReadTemplate is how the share benchmarks learn the deployment's memory
// and workers: it must read what the template says.
func TestReadTemplateReadsTheDispatchFunction(t *testing.T) {
	t.Parallel()
	f, err := deploybench.ReadTemplate("../../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if f.DispatchMemoryMB != deploybench.TemplateMemoryMB || f.DispatchMaxWorkers != deploybench.TemplateMaxWorkers {
		t.Errorf("ReadTemplate: %+v, want %d MB and %d workers", f, deploybench.TemplateMemoryMB, deploybench.TemplateMaxWorkers)
	}
}
