package route

import (
	"encoding/json"
	"testing"
)

// The schema as a test reads it.

func targetTypes() []string {
	return loadRoutesSchema().list("/$defs/target/properties/type", "enum")
}

// payloadMaxima are the largest max_payload_bytes by target type, from the
// route's branches of the schema.
func payloadMaxima(t testing.TB) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, b := range payloadBranches(t) {
		out[b.targetType] = b.maximum
	}
	return out
}

type payloadBranch struct {
	targetType        string
	maximum, fallback int
}

func payloadBranches(t testing.TB) []payloadBranch {
	t.Helper()
	var route struct {
		AllOf []struct {
			If struct {
				Properties struct {
					Target struct {
						Properties struct {
							Type struct {
								Const string `json:"const"`
							} `json:"type"`
						} `json:"properties"`
					} `json:"target"`
				} `json:"properties"`
			} `json:"if"`
			Then struct {
				Properties struct {
					MaxPayloadBytes struct {
						Maximum int `json:"maximum"`
						Default int `json:"default"`
					} `json:"max_payload_bytes"`
				} `json:"properties"`
			} `json:"then"`
		} `json:"allOf"`
	}
	var schema struct {
		Defs map[string]json.RawMessage `json:"$defs"`
	}
	if err := json.Unmarshal(routesSchemaJSON, &schema); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(schema.Defs["route"], &route); err != nil {
		t.Fatal(err)
	}
	var out []payloadBranch
	for _, b := range route.AllOf {
		mp := b.Then.Properties.MaxPayloadBytes
		out = append(out, payloadBranch{b.If.Properties.Target.Properties.Type.Const, mp.Maximum, mp.Default})
	}
	if len(out) != len(targetTypes()) {
		t.Fatalf("the schema has payload limits for %d target types, want %d", len(out), len(targetTypes()))
	}
	return out
}
