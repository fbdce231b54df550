package nodeagent

import (
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/podstate"
)

// TestByAnnotations: without an API server, a pod's own
// istio.io/dataplane-mode annotation enrolls it, read as Istio reads the
// label, with the same exclusions, and its overrides apply.
func TestByAnnotations(t *testing.T) {
	for _, c := range []struct {
		name        string
		annotations map[string]string
		enrolled    bool
		why         string
		pod         ambient.Overrides
	}{
		{"no annotation", nil, false, "", ambient.Overrides{}},
		{"ambient", map[string]string{"istio.io/dataplane-mode": "ambient"}, true, "", ambient.Overrides{}},
		{"none", map[string]string{"istio.io/dataplane-mode": "none"}, false, "", ambient.Overrides{}},
		{"sidecar", map[string]string{"istio.io/dataplane-mode": "ambient", "sidecar.istio.io/status": "{}"}, false, "sidecar", ambient.Overrides{}},
		{"overrides", map[string]string{"istio.io/dataplane-mode": "ambient", "ambient.istio.io/dns-capture": "false", "ambient.istio.io/bypass-inbound-capture": "true"},
			true, "", ambient.Overrides{DNS: ambient.DNSOff, Ingress: true}},
		{"bad override", map[string]string{"istio.io/dataplane-mode": "ambient", "ambient.istio.io/dns-capture": "maybe"},
			true, "ambient.istio.io/dns-capture", ambient.Overrides{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := byAnnotations(podstate.Record{Namespace: "shop", Name: "web", Annotations: c.annotations})
			if e.Enrolled != c.enrolled || !strings.Contains(e.Why, c.why) || e.Overrides.DNS != c.pod.DNS || e.Overrides.Ingress != c.pod.Ingress {
				t.Fatalf("byAnnotations(%v) = %+v, want enrolled %v (why containing %q), pod %+v", c.annotations, e, c.enrolled, c.why, c.pod)
			}
		})
	}
}
