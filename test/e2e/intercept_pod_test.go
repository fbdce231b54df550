package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// TestInterceptPerPod runs the intercept plugin as containerd runs it for a
// Kubernetes pod (the pod-annotations capability, K8S_POD_* in CNI_ARGS):
// only a pod with a sidecar gets rules, with its annotations' settings; a
// plain pod keeps working untouched; CHECK verifies what ADD decided; a
// malformed annotation fails with code 7 naming it and changes nothing.
func TestInterceptPerPod(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	e := ie.New(t, h)
	e.StartProxy(true)
	clean := interceptRuleState(t, e, "nft")
	list := h.ConfList(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwti-mesh","plugins":[{"type":"loopback"},
		{"type":"intercept","istio-service-cidr":"*","istio-inbound-ports":"*","dual-stack":true,
		 "capabilities":{%q:true}}]}`, "io.kubernetes.cri.pod-annotations"))
	attach := func(ns string, annotations map[string]string) *harness.Attachment {
		a := h.Attach(list, e.Pod, "lo", map[string]any{"io.kubernetes.cri.pod-annotations": annotations})
		a.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", ns}, {"K8S_POD_NAME", "p1"}, {"K8S_POD_INFRA_CONTAINER_ID", a.RT.ContainerID}}
		return a
	}
	remote, pod := ie.AP(ie.RemoteV4, ie.RemotePort), ie.AP(ie.PodV4, ie.AppPort)
	relo := func() {
		t.Helper()
		if out, err := e.Pod.Exec("ip", "link", "set", "lo", "up"); err != nil {
			t.Fatalf("lo up: %v %s", err, out)
		}
	}

	t.Run("sidecar", func(t *testing.T) {
		a := attach("shop", map[string]string{
			"sidecar.istio.io/status":                      `{"containers":["istio-proxy"]}`,
			"sidecar.istio.io/interceptionMode":            "TPROXY",
			"traffic.sidecar.istio.io/excludeInboundPorts": fmt.Sprint(ie.AppPort2),
		})
		a.MustAdd()
		if err := a.Check(); err != nil {
			t.Fatalf("CHECK: %v", err)
		}
		interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "outbound")
		interceptExpect(t, e, e.Remote, pod, "app", "127.0.0.6", "inbound")
		// The pod's excludeInboundPorts annotation applies.
		interceptExpect(t, e, e.Remote, ie.AP(ie.PodV4, ie.AppPort2), "app", ie.RemoteV4.String(), "")
		if !strings.Contains(interceptRuleState(t, e, "nft"), "TPROXY") {
			t.Fatal("the pod's interceptionMode annotation (TPROXY) was not applied")
		}
		if err := a.Del(); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		relo()
		if got := interceptRuleState(t, e, "nft"); got != clean {
			t.Fatalf("DEL left rules:\n%s", got)
		}
	})

	for _, tc := range []struct {
		name, ns    string
		annotations map[string]string
	}{
		{"plain pod", "shop", map[string]string{"app": "batch"}},
		{"inject false", "shop", map[string]string{"sidecar.istio.io/status": "{}", "sidecar.istio.io/inject": "false"}},
		{"kube-system", "kube-system", map[string]string{"sidecar.istio.io/status": "{}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := attach(tc.ns, tc.annotations)
			res := a.MustAdd()
			if got := interceptRuleState(t, e, "nft"); got != clean {
				t.Fatalf("a pod without a sidecar got rules:\n%s", got)
			}
			if len(res.Interfaces) != 1 || res.Interfaces[0].Name != "lo" {
				t.Fatalf("the result was not passed on: %+v", res)
			}
			interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "")
			interceptExpect(t, e, e.Remote, pod, "app", ie.RemoteV4.String(), "")
			if err := a.Check(); err != nil {
				t.Fatalf("CHECK of a pod left alone: %v", err)
			}
			// CHECK verifies ADD's decision: rules in a pod that should
			// have none fail it.
			e.MustIptablesInit("-m", "REDIRECT", "-i", "*", "-b", "*")
			if err := a.Check(); err == nil || !strings.Contains(err.Error(), "not intercepted") {
				t.Fatalf("CHECK with rules in a pod left alone: %v", err)
			}
			if code, out := e.IptablesInit("--cleanup-only"); code != 0 {
				t.Fatalf("iptables-init --cleanup-only: %d %s", code, out)
			}
			if err := a.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			relo()
		})
	}

	t.Run("malformed annotation", func(t *testing.T) {
		a := attach("shop", map[string]string{"sidecar.istio.io/status": "{}", "traffic.sidecar.istio.io/includeInboundPorts": "80,http"})
		_, err := a.Add()
		var ce *types.Error
		if !asCNIError(err, &ce) || ce.Code != 7 || !strings.Contains(ce.Msg, "traffic.sidecar.istio.io/includeInboundPorts") {
			t.Fatalf("ADD: %v, want code 7 naming the annotation", err)
		}
		_ = a.Del()
		relo()
		if got := interceptRuleState(t, e, "nft"); got != clean {
			t.Fatalf("a failed ADD left rules:\n%s", got)
		}
	})
}
