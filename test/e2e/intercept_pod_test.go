//go:build kernel

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
		return ie.PodAttach(h, list, e.Pod, ns, annotations)
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

// istioStatus is sidecar.istio.io/status as Istio's injector writes it
// for a pod whose rules istio-cni installs (no istio-init).
const istioStatus = `{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":["workload-socket","credential-socket","workload-certs","istio-envoy","istio-data","istio-podinfo","istio-token","istiod-ca-cert"],"imagePullSecrets":null,"revision":"default"}`

// TestInterceptIstioCNI runs the intercept plugin as `meshwire install
// --chain` puts it into a node's config, for pods annotated as Istio's
// injector annotates them, with real traffic: the sidecar's status ports
// reach the pod directly, the proxy.istio.io/config annotation turns DNS
// capture on, and a pod with the istio-init container gets its rules from
// that container only, one set.
func TestInterceptIstioCNI(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	e := ie.New(t, h)
	e.StartProxy(false)
	clean := interceptRuleState(t, e, "nft")
	// The intercept entry exactly as --chain writes it, after loopback
	// (the pod's links are the test's own: portmap and bandwidth, which
	// --chain adds too, need an interface plugin's veth).
	list := loopbackIntercept(t, h, "mwti-mesh")
	attach := func(annotations map[string]string) *harness.Attachment {
		return ie.PodAttach(h, list, e.Pod, "shop", annotations)
	}
	del := func(a *harness.Attachment) {
		t.Helper()
		if err := a.Del(); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		if out, err := e.Pod.Exec("ip", "link", "set", "lo", "up"); err != nil {
			t.Fatalf("lo up: %v %s", err, out)
		}
		if got := interceptRuleState(t, e, "nft"); got != clean {
			t.Fatalf("DEL left rules:\n%s", got)
		}
	}
	remote, dns := ie.AP(ie.RemoteV4, ie.RemotePort), ie.AP(ie.RemoteV4, ie.DNSPort)

	t.Run("status-ports", func(t *testing.T) {
		a := attach(map[string]string{"sidecar.istio.io/status": istioStatus})
		a.MustAdd()
		if err := a.Check(); err != nil {
			t.Fatalf("CHECK: %v", err)
		}
		interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "outbound")
		interceptExpect(t, e, e.Remote, ie.AP(ie.PodV4, ie.AppPort), "app", "127.0.0.6", "inbound")
		// kubelet's readiness probe reaches the sidecar's port itself.
		interceptExpect(t, e, e.Remote, ie.AP(ie.PodV4, ie.StatusPort), "app", ie.RemoteV4.String(), "")
		// DNS is not captured without ISTIO_META_DNS_CAPTURE.
		interceptQuery(t, e, dns, "remote-dns:")
		del(a)
	})

	t.Run("dns-capture", func(t *testing.T) {
		a := attach(map[string]string{"sidecar.istio.io/status": istioStatus,
			"proxy.istio.io/config": "proxyMetadata:\n  ISTIO_META_DNS_CAPTURE: \"true\"\n"})
		a.MustAdd()
		if err := a.Check(); err != nil {
			t.Fatalf("CHECK: %v", err)
		}
		before := len(e.RemoteDNSSources())
		interceptQuery(t, e, dns, "proxy:remote-dns:")
		if srcs := e.RemoteDNSSources(); len(srcs) != before+3 {
			t.Fatalf("the proxy's upstream query did not reach the server: %v", srcs)
		}
		del(a)
	})

	t.Run("istio-init", func(t *testing.T) {
		a := attach(map[string]string{"sidecar.istio.io/status": `{"initContainers":["istio-init"],"containers":["istio-proxy"]}`})
		a.MustAdd()
		if got := interceptRuleState(t, e, "nft"); got != clean {
			t.Fatalf("the plugin intercepted a pod with istio-init:\n%s", got)
		}
		// Then the init container runs, as Istio's injector has it.
		if code, out := e.IptablesInit(istioInitArgs("REDIRECT")...); code != 0 {
			t.Fatalf("istio-init: exit %d\n%s", code, out)
		}
		rules, err := e.Pod.Exec("iptables-nft-save", "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(rules, "-A OUTPUT "); n != 1 {
			t.Fatalf("%d jumps from OUTPUT, want one set of rules:\n%s", n, rules)
		}
		if err := a.Check(); err != nil {
			t.Fatalf("CHECK with istio-init's rules: %v", err)
		}
		interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "outbound")
		if code, out := e.IptablesInit("--cleanup-only"); code != 0 {
			t.Fatalf("--cleanup-only: %d %s", code, out)
		}
		del(a)
	})
}
