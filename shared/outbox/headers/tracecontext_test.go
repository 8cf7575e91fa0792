package headers

import "testing"

// X-Ray's header of a traceparent names the same trace, parent and
// sampling decision, and nothing is made of what is not a valid one.
func TestXRayTraceHeader(t *testing.T) {
	t.Parallel()
	for parent, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03": "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00": "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=0",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02": "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=0",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "",
		"": "",
	} {
		if got := XRayTraceHeader(parent); got != want {
			t.Errorf("XRayTraceHeader(%q) = %q, want %q", parent, got, want)
		}
	}
}
