//go:build kernel

package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/ebpf/capture"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// interceptEBPFAttach attaches the fast path and the ebpf interception
// programs (`meshwire fastpath attach`) for TestInterceptTraffic's EBPF
// mode, and detaches them, forced, when t ends.
func interceptEBPFAttach(t *testing.T, h *harness.H) {
	t.Helper()
	if code, out, err := ie.Fastpath(h, "attach"); err != nil || code != 0 {
		t.Fatalf("meshwire fastpath attach: exit %d, %v\n%s", code, err, out)
	}
	t.Cleanup(func() {
		if code, out, err := ie.Fastpath(h, "detach", "--force"); err != nil || code != 0 {
			t.Errorf("meshwire fastpath detach: exit %d, %v\n%s", code, err, out)
		}
	})
}

// interceptEBPFChecks, after EBPF mode's traffic: a host connection is
// not captured, and the pod's namespace has no conntrack entry, no
// nftables rule and no iptables table.
func interceptEBPFChecks(t *testing.T, e *ie.Env) {
	t.Run("host-untouched", func(t *testing.T) {
		// A host connection to an address a pod's would be captured for
		// (every destination, -i "*") is not sent to a listener on the
		// host's 127.0.0.1:15001: the host namespace is never a pod's.
		// (The remote namespace's requests to the pod show the same for
		// a namespace that is not registered.)
		ln, err := net.Listen("tcp", "127.0.0.1:15001")
		if err != nil {
			t.Fatalf("listen on the host's 127.0.0.1:15001 (the test needs it free): %v", err)
		}
		defer ln.Close()
		accepted := make(chan struct{}, 1)
		go func() {
			if c, err := ln.Accept(); err == nil {
				c.Close()
				accepted <- struct{}{}
			}
		}()
		c, err := net.DialTimeout("tcp", "203.0.113.1:80", 300*time.Millisecond)
		if err == nil {
			c.Close()
		}
		select {
		case <-accepted:
			t.Fatal("a host connection to 203.0.113.1:80 reached the host's 127.0.0.1:15001")
		case <-time.After(100 * time.Millisecond):
		}
	})

	t.Run("no-netfilter", func(t *testing.T) { assertNoNetfilter(t, e.Pod) })
}

// assertNoNetfilter fails t unless ns has no conntrack entry, no nftables
// rule and no iptables table: what EBPF mode leaves in a pod.
func assertNoNetfilter(t *testing.T, ns *harness.NS) {
	t.Helper()
	out, err := ns.Exec("conntrack", "-L")
	if err != nil {
		t.Fatalf("conntrack -L in the pod: %v\n%s", err, out)
	}
	if !strings.Contains(out, " 0 flow entries have been shown") {
		t.Fatalf("the pod's namespace has conntrack entries after the traffic, want none:\n%s", out)
	}
	for _, tool := range [][]string{{"nft", "list", "ruleset"}, {"cat", "/proc/net/ip_tables_names"}, {"cat", "/proc/net/ip6_tables_names"}} {
		out, err := ns.Exec(tool[0], tool[1:]...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", tool, err, out)
		}
		if strings.TrimSpace(out) != "" {
			t.Fatalf("%s in the pod shows rules or tables:\n%s", strings.Join(tool, " "), out)
		}
	}
}

// TestInterceptEBPFPod runs the chained intercept plugin through libcni as
// containerd runs it, for an Istio pod whose meshwire annotation selects
// EBPF mode, with the fast path and the interception programs attached as
// the node agent attaches them: ADD registers the pod (CHECK agrees), its
// connections go through the sidecar both ways with no netfilter in the
// pod, and the fast path carries them (the plugin wrote the Istio pod's
// policy). Then the pod is deleted with connections open: they keep
// working through the sidecar to their end, a new connection is no longer
// captured, and DEL left no registration and no inbound filter, so the
// programs detach without force.
func TestInterceptEBPFPod(t *testing.T) {
	h := harness.New(t)
	fastpathAttach(t, h)
	e := ie.New(t, h)
	e.StartProxy(false)
	list := h.ConfList(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwti-ebpf","plugins":[{"type":"loopback"},
		{"type":"intercept","istio-service-cidr":"*","istio-inbound-ports":"*","dual-stack":true,
		 "capabilities":{%q:true}}]}`, "io.kubernetes.cri.pod-annotations"))
	a := h.Attach(list, e.Pod, "lo", map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{
		"sidecar.istio.io/status":    `{"containers":["istio-proxy"]}`,
		"intercept.meshwire.io/mode": "EBPF",
	}})
	a.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "p1"}, {"K8S_POD_INFRA_CONTAINER_ID", a.RT.ContainerID}}
	a.MustAdd()
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = a.Del()
		}
	})
	if err := a.Check(); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if st := captureStatus(t, h); st.Pods != 1 {
		t.Fatalf("after ADD, %d pods registered, want 1", st.Pods)
	}
	remote, pod := ie.AP(ie.RemoteV4, ie.RemotePort), ie.AP(ie.PodV4, ie.AppPort)
	interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "outbound")
	interceptExpect(t, e, e.Remote, pod, "app", "127.0.0.6", "inbound")

	before := fastpathStatus(t, h)
	out, err := ie.Dial(e.Pod, remote)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	in, err := ie.Dial(e.Remote, pod)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	outPrefix, inPrefix := "remote "+ie.PodV4.String()+" ", "app 127.0.0.6 "
	pingPong(t, out, 20, randomLine(1000), outPrefix)
	pingPong(t, in, 20, randomLine(1000), inPrefix)
	after := fastpathStatus(t, h)
	if d := after.Counters.Sub(before.Counters); d.Pairs != 2 || d.KeptForProxy != 0 || d.RedirectedMessages < 2*2*20-4 {
		t.Fatalf("the fast path should carry both connections both ways (the plugin wrote the Istio pod's policy): %+v", d)
	}

	if err := a.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	deleted = true
	// The connections open at DEL keep going through the sidecar.
	pingPong(t, out, 20, randomLine(3000), outPrefix)
	pingPong(t, in, 20, randomLine(3000), inPrefix)
	// A new one is not captured any more, either way.
	interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "")
	interceptExpect(t, e, e.Remote, pod, "app", ie.RemoteV4.String(), "")
	if st := captureStatus(t, h); st.Pods != 0 {
		t.Fatalf("after DEL, %d pods registered, want 0", st.Pods)
	}
	if out, err := e.Pod.Exec("tc", "filter", "show", "dev", "mwti0", "ingress"); err != nil || strings.Contains(out, "meshwire") {
		t.Fatalf("after DEL, the pod's interface still has an inbound filter (%v):\n%s", err, out)
	}
	assertNoNetfilter(t, e.Pod)
}

// captureStatus is `meshwire fastpath status --json`'s ebpf interception
// part.
func captureStatus(t *testing.T, h *harness.H) capture.Status {
	t.Helper()
	st, err := ie.CaptureStatus(h)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
