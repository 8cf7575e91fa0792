package outboxtype_test

import (
	"os"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// Every code an operator can meet is explained in docs/CONFIGURATION.md's
// error table.
func TestTheDocsExplainEveryCode(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/CONFIGURATION.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range outboxtype.Codes {
		if !strings.Contains(string(raw), "| `"+string(c)+"` |") {
			t.Errorf("docs/CONFIGURATION.md's error table does not explain %s", c)
		}
	}
}
