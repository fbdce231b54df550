package capture

import (
	"slices"
	"testing"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/internal/structlayout"
)

// TestLayoutsMatch: the map layouts package pods writes without loading
// the object are the object's own (bpf2go's types from capture.c), field
// by field.
func TestLayoutsMatch(t *testing.T) {
	for _, c := range []struct {
		name      string
		ours, gen any
	}{
		{"struct pod_capture", pods.Capture{}, bpfPodCapture{}},
		{"struct port_key", pods.PortKey{}, bpfPortKey{}},
		{"struct cidr_key", pods.CIDRKey{}, bpfCidrKey{}},
	} {
		if got, want := structlayout.Describe(c.ours, false), structlayout.Describe(c.gen, false); !slices.Equal(got, want) {
			t.Errorf("%s: package pods has %v, the object %v", c.name, got, want)
		}
	}
}
