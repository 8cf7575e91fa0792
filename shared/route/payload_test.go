package route

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func schemaRoute(t *testing.T, schema string) *Route {
	t.Helper()
	table, err := Parse([]byte(config(routeTo(lambdaTarget, `"name": "billing-usage", "schema": `+schema))), Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := table.Routes[0]
	if !r.HasSchema() {
		t.Fatal("the route has no schema")
	}
	return r
}

const usageSchema = `{
	"type": "object",
	"required": ["tenant_id", "tokens"],
	"properties": {
		"tenant_id": {"type": "string", "pattern": "^tenant-[0-9]+$"},
		"tokens": {"type": "integer", "minimum": 0},
		"email": {"type": "string", "format": "email"},
		"lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}
	},
	"$defs": {"line": {"type": "object", "required": ["sku"]}}
}`

func TestCheckPayload(t *testing.T) {
	t.Parallel()
	r := schemaRoute(t, usageSchema)
	for _, tc := range []struct {
		name, payload string
		want          []string // the violations, in order; none: valid
	}{
		{"valid", `{"tenant_id": "tenant-42", "tokens": 1200, "lines": [{"sku": "a"}]}`, nil},
		{"missing property", `{"tenant_id": "tenant-42"}`, []string{`at /: missing property 'tokens' (schema rule /required)`}},
		{"below minimum", `{"tenant_id": "tenant-42", "tokens": -5}`, []string{`at /tokens: minimum: got -5, want 0 (schema rule /properties/tokens/minimum)`}},
		{"wrong type", `{"tenant_id": 42, "tokens": 1}`, []string{`at /tenant_id: got number, want string (schema rule /properties/tenant_id/type)`}},
		{"through a $ref", `{"tenant_id": "tenant-1", "tokens": 1, "lines": [{"sku": "a"}, {}]}`, []string{`at /lines/1: missing property 'sku' (schema rule /$defs/line/required)`}},
		{"several", `{"tenant_id": "tenant-1", "tokens": 1.5, "lines": "none"}`, []string{
			`at /lines: got string, want array (schema rule /properties/lines/type)`,
			`at /tokens: got number, want integer (schema rule /properties/tokens/type)`,
		}},
		{"pattern without quoting the payload", `{"tenant_id": "jane.doe@example.com", "tokens": 1}`, []string{`at /tenant_id: does not match the pattern "^tenant-[0-9]+$" (schema rule /properties/tenant_id/pattern)`}},
		{"not an object", `[1, 2]`, []string{`at /: got array, want object (schema rule /type)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := r.CheckPayload([]byte(tc.payload))
			if tc.want == nil {
				if err != nil {
					t.Fatalf("CheckPayload: %v", err)
				}
				return
			}
			pe, ok := errors.AsType[*PayloadError](err)
			if !ok || !errors.Is(err, ErrInvalidPayload) {
				t.Fatalf("err = %v (%T), want a *PayloadError", err, err)
			}
			if got := pe.Error(); got != strings.Join(tc.want, "; ") {
				t.Errorf("error\n%s\nwant\n%s", got, strings.Join(tc.want, "; "))
			}
			if strings.Contains(err.Error(), "jane.doe") {
				t.Errorf("the error quotes the payload: %v", err)
			}
		})
	}
}

// "format" is an annotation in draft 2020-12, as the package documents.
func TestCheckPayloadFormatIsAnAnnotation(t *testing.T) {
	t.Parallel()
	r := schemaRoute(t, usageSchema)
	if err := r.CheckPayload([]byte(`{"tenant_id": "tenant-1", "tokens": 1, "email": "not an address"}`)); err != nil {
		t.Errorf("CheckPayload: %v", err)
	}
}

func TestCheckPayloadCapsTheViolations(t *testing.T) {
	t.Parallel()
	var props, payload []string
	for i := range 8 {
		props = append(props, fmt.Sprintf(`"p%d": {"type": "integer"}`, i))
		payload = append(payload, fmt.Sprintf(`"p%d": "x"`, i))
	}
	r := schemaRoute(t, `{"properties": {`+strings.Join(props, ",")+`}}`)
	err := r.CheckPayload([]byte(`{` + strings.Join(payload, ",") + `}`))
	pe, ok := errors.AsType[*PayloadError](err)
	if !ok {
		t.Fatalf("err = %v, want a *PayloadError", err)
	}
	if len(pe.Violations) != maxViolations || pe.More != 8-maxViolations {
		t.Errorf("%d violations and %d more, want %d and %d", len(pe.Violations), pe.More, maxViolations, 8-maxViolations)
	}
	if !strings.HasSuffix(err.Error(), "; and 3 more") {
		t.Errorf("err = %v, want it to end with the count left out", err)
	}
	if pe.Violations[0].InstanceLocation != "/p0" || pe.Violations[4].InstanceLocation != "/p4" {
		t.Errorf("violations not in payload order: %v", pe.Violations)
	}
}

func TestCheckPayloadBooleanSchemas(t *testing.T) {
	t.Parallel()
	if err := schemaRoute(t, `true`).CheckPayload([]byte(`{"any": 1}`)); err != nil {
		t.Errorf("true schema: %v", err)
	}
	err := schemaRoute(t, `false`).CheckPayload([]byte(`{"any": 1}`))
	if !errors.Is(err, ErrInvalidPayload) || !strings.Contains(err.Error(), "at /: false schema") {
		t.Errorf("false schema: err = %v", err)
	}
}

func TestCheckPayloadInvalidJSON(t *testing.T) {
	t.Parallel()
	err := schemaRoute(t, `true`).CheckPayload([]byte(`{"a":`))
	if !errors.Is(err, ErrInvalidPayload) || !strings.Contains(err.Error(), "the payload is not valid JSON") {
		t.Errorf("err = %v", err)
	}
}

func TestCheckPayloadWithoutSchema(t *testing.T) {
	t.Parallel()
	table, err := Parse([]byte(config(routeTo(lambdaTarget))), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, payload := range []string{`{}`, `[1]`, `not even JSON`} {
		if err := table.Routes[0].CheckPayload([]byte(payload)); err != nil {
			t.Errorf("CheckPayload(%s) = %v, want nil without a schema", payload, err)
		}
	}
}

func TestSchemaIsStoredCanonical(t *testing.T) {
	t.Parallel()
	r := schemaRoute(t, `{ "type" : "object",  "required": ["a"] }`)
	if got, want := string(r.Schema), `{"required":["a"],"type":"object"}`; got != want {
		t.Errorf("Schema = %s, want %s", got, want)
	}
}
