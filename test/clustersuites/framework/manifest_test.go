package framework

import (
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
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

// TestFamilyVars: the suites' manifests render on either family into
// objects that decode strictly; on a dual-stack cluster their Services
// are RequireDualStack and the sidecar pods ask for Istio's dual stack
// (ISTIO_DUAL_STACK in their ProxyConfig, which meshwire's intercept
// reads, and in istio-proxy's environment, which istio-cni reads); on an
// IPv4 one, SingleStack and false. A suite's own value wins.
func TestFamilyVars(t *testing.T) {
	for family, want := range map[string]struct{ policy, dual string }{
		"":     {"SingleStack", "false"},
		"ipv4": {"SingleStack", "false"},
		"dual": {"RequireDualStack", "true"},
	} {
		c := &Cluster{Description: Description{Repo: "../../..", IPFamily: family}}
		vars := map[string]string{"NAMESPACE": "ns", "NAME": "app-redirect", "NODE": "node", "MODE": "redirect",
			"ISTIO_MODE": "REDIRECT", "MESHWIRE_MODE": "REDIRECT", "PROXY_MODE": "redirect", "PROXY_UID": "1337", "PROXY_CAPS": "[]",
			"NODE_A": "a", "NODE_B": "b", "REDIRECT": "fd6d:776b:2::a", "TPROXY": "fd6d:776b:2::b", "EBPF": "fd6d:776b:2::c"}
		services := 0
		for _, name := range []string{"mesh.yaml", "mesh-service.yaml", "ambient.yaml", "mesh-long.yaml"} {
			b, err := c.Manifest(name, vars)
			if err != nil {
				t.Fatalf("%s on %q: %v", name, family, err)
			}
			for _, doc := range strings.Split(string(b), "\n---\n") {
				var meta struct{ Kind string }
				if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				switch meta.Kind {
				case "Service":
					var s corev1.Service
					if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					services++
					if s.Spec.IPFamilyPolicy == nil || string(*s.Spec.IPFamilyPolicy) != want.policy {
						t.Errorf("%s on %q: Service %s's ipFamilyPolicy %v, want %s", name, family, s.Name, s.Spec.IPFamilyPolicy, want.policy)
					}
				case "Deployment":
					var d appsv1.Deployment
					if err := yaml.UnmarshalStrict([]byte(doc), &d); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					pc := d.Spec.Template.Annotations["proxy.istio.io/config"]
					var cfg struct{ ProxyMetadata map[string]string }
					if err := yaml.Unmarshal([]byte(pc), &cfg); err != nil || cfg.ProxyMetadata["ISTIO_DUAL_STACK"] != want.dual {
						t.Errorf("%s on %q: proxy.istio.io/config %q (%v), want ISTIO_DUAL_STACK %s", name, family, pc, err, want.dual)
					}
					env := ""
					for _, ct := range d.Spec.Template.Spec.Containers {
						for _, e := range ct.Env {
							if ct.Name == "istio-proxy" && e.Name == "ISTIO_DUAL_STACK" {
								env = e.Value
							}
						}
					}
					if env != want.dual {
						t.Errorf("%s on %q: istio-proxy's ISTIO_DUAL_STACK %q, want %s", name, family, env, want.dual)
					}
				case "Pod", "Namespace":
					var o any = &corev1.Pod{}
					if meta.Kind == "Namespace" {
						o = &corev1.Namespace{}
					}
					if err := yaml.UnmarshalStrict([]byte(doc), o); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
				default:
					t.Fatalf("%s: kind %q", name, meta.Kind)
				}
			}
		}
		if services != 2 {
			t.Errorf("%q: %d Services rendered, want 2", family, services)
		}
	}
	// A suite's own value wins over the cluster's.
	c := &Cluster{Description: Description{Repo: "../../..", IPFamily: "dual"}}
	b, err := c.Manifest("mesh-service.yaml", map[string]string{"NAMESPACE": "ns", "MODE": "redirect", "IP_FAMILY_POLICY": "PreferDualStack"})
	if err != nil || !strings.Contains(string(b), "ipFamilyPolicy: PreferDualStack") {
		t.Errorf("a suite's IP_FAMILY_POLICY was not kept: %v\n%s", err, b)
	}
}
