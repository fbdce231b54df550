package capture

import (
	"reflect"
	"testing"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
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
		o, g := reflect.TypeOf(c.ours), reflect.TypeOf(c.gen)
		if o.Size() != g.Size() {
			t.Fatalf("%s: %d bytes in package pods, %d in the object", c.name, o.Size(), g.Size())
		}
		var gf []reflect.StructField
		for i := range g.NumField() {
			if f := g.Field(i); f.Name != "_" {
				gf = append(gf, f)
			}
		}
		if o.NumField() != len(gf) {
			t.Fatalf("%s: %d fields in package pods, %d in the object", c.name, o.NumField(), len(gf))
		}
		for i, f := range gf {
			of := o.Field(i)
			if of.Offset != f.Offset || of.Type.Size() != f.Type.Size() {
				t.Errorf("%s: field %s at %d (%d bytes) in package pods, %s at %d (%d bytes) in the object", c.name, of.Name, of.Offset, of.Type.Size(), f.Name, f.Offset, f.Type.Size())
			}
		}
	}
}
