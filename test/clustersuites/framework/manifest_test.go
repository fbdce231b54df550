package framework

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestRender(t *testing.T) {
	got, err := Render([]byte("# @KEPT@\nname: @A@-@B@\n"), map[string]string{"A": "x", "B": "y"})
	if err != nil || string(got) != "# @KEPT@\nname: x-y\n" {
		t.Errorf("Render: %q, %v", got, err)
	}
	if _, err := Render([]byte("name: @A@ @C@\n"), map[string]string{"A": "x"}); err == nil {
		t.Error("a placeholder without a value was rendered")
	}
}

// TestIstioPodStartManifest: the sidecar pod of TestIstioPodStartCompare
// decodes, and has the shape istio-cni acts on (istio-cni's cni/pkg/plugin/plugin.go: the
// sidecar status annotation, an istio-proxy container, no istio-init)
// in REDIRECT.
func TestIstioPodStartManifest(t *testing.T) {
	b, err := os.ReadFile("../../cluster/manifests/istio-podstart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err = Render(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := DecodePod(b)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		names = append(names, c.Name)
	}
	status := p.Annotations["sidecar.istio.io/status"]
	if !slices.Contains(names, "istio-proxy") || slices.Contains(names, "istio-init") ||
		!strings.Contains(status, `"containers":["istio-proxy"]`) || !strings.Contains(status, `"initContainers":null`) ||
		p.Annotations["sidecar.istio.io/interceptionMode"] != "REDIRECT" {
		t.Errorf("containers %v, annotations %v: not a REDIRECT sidecar pod as istio-cni's injector leaves it", names, p.Annotations)
	}
	if _, err := DecodePod([]byte("kind: Pod\nspec: {containerz: []}\n")); err == nil {
		t.Error("an unknown key was decoded")
	}
}
