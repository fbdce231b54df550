package manifests

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// TestIstioInitManifest: the cluster suites' init-container pods
// (test/cluster/manifests/istio-init.yaml, TestIstioRules) render, for
// meshwire's iptables-init and Istio's pilot-agent, into Deployments that
// decode strictly, whose istio-init runs the injector's arguments with
// NET_ADMIN and NET_RAW only, and that neither istio-cni nor meshwire's
// intercept touches (the sidecar status names istio-init).
func TestIstioInitManifest(t *testing.T) {
	b, err := os.ReadFile(clusterDir + "/manifests/istio-init.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ image, command, args0 string }{
		{"localhost/meshwire:latest", `["iptables-init"]`, ""},
		{"localhost/istio/proxyv2:meshwire-test", "null", "istio-iptables"},
	} {
		for _, mode := range []string{"REDIRECT", "TPROXY"} {
			args := framework.IstioInitArgs(mode)
			if r.args0 != "" {
				args = append([]string{r.args0}, args...)
			}
			j, _ := json.Marshal(args)
			out, err := framework.Render(b, map[string]string{"NAMESPACE": "ns", "NAME": "init", "NODE": "node",
				"INIT_IMAGE": r.image, "INIT_COMMAND": r.command, "INIT_ARGS": string(j), "ISTIO_MODE": mode,
				"PROXY_MODE": "redirect", "PROXY_UID": "1337", "PROXY_CAPS": "[]"})
			if err != nil {
				t.Fatal(err)
			}
			docs := splitDocuments(t, "istio-init.yaml", out)
			var d appsv1.Deployment
			if len(docs) != 1 {
				t.Fatalf("%d documents", len(docs))
			}
			if err := strict(docs[0], &d); err != nil {
				t.Fatalf("%s %s: %v", r.image, mode, err)
			}
			spec := d.Spec.Template.Spec
			if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "istio-init" {
				t.Fatalf("%s %s: no istio-init alone: %v", r.image, mode, spec.InitContainers)
			}
			c := spec.InitContainers[0]
			wantCmd := []string(nil)
			if r.command != "null" {
				wantCmd = []string{"iptables-init"}
			}
			if c.Image != r.image || !slices.Equal(c.Command, wantCmd) || !slices.Equal(c.Args, args) {
				t.Errorf("%s %s: istio-init runs %s %q %q", r.image, mode, c.Image, c.Command, c.Args)
			}
			sc := c.SecurityContext
			if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN", "NET_RAW"}) ||
				!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || sc.Privileged == nil || *sc.Privileged {
				t.Errorf("%s %s: istio-init's security context is not the injector's (NET_ADMIN and NET_RAW only): %+v", r.image, mode, sc)
			}
			var st struct{ InitContainers []string }
			if err := json.Unmarshal([]byte(d.Spec.Template.Annotations["sidecar.istio.io/status"]), &st); err != nil || !slices.Contains(st.InitContainers, "istio-init") {
				t.Errorf("%s %s: the sidecar status does not name istio-init: %v", r.image, mode, err)
			}
			if d.Spec.Template.Annotations["sidecar.istio.io/interceptionMode"] != mode {
				t.Errorf("%s %s: interceptionMode %q", r.image, mode, d.Spec.Template.Annotations["sidecar.istio.io/interceptionMode"])
			}
		}
	}
}
