//go:build kernel

package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// TestInterceptEBPFPod runs the chained intercept plugin through libcni as
// containerd runs it, for an Istio pod whose meshwire annotation selects
// EBPF mode and Istio's DNS capture, with the interception programs
// attached: ADD registers the pod (CHECK agrees), its connections go
// through the sidecar both ways and its DNS queries to the sidecar's DNS
// port, with no netfilter in the pod. Then the pod is deleted with
// connections open: they keep working through the sidecar to their end,
// a new connection or query is no longer captured, and DEL left no
// registration and no inbound filter. (The fast path in EBPF mode: the TestFastpath* tests.)
func TestInterceptEBPFPod(t *testing.T) {
	h := harness.New(t)
	// Last: every socket of the test closed, the fast path's sockhash is
	// gone with its detach.
	t.Cleanup(func() { waitSockhashFreed(t) })
	interceptEBPFAttach(t, h)
	e := ie.New(t, h)
	e.StartProxy(false)
	a := ie.ChainedIntercept(h, "mwti-ebpf", e.Pod, map[string]string{
		"sidecar.istio.io/status":    `{"containers":["istio-proxy"]}`,
		"intercept.meshwire.io/mode": "EBPF",
		"proxy.istio.io/config":      "proxyMetadata:\n  ISTIO_META_DNS_CAPTURE: \"true\"\n",
	})
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
	dns := ie.AP(ie.RemoteV4, ie.DNSPort)
	interceptQuery(t, e, dns, "proxy:remote-dns:")

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

	if err := a.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	deleted = true
	// loopback's DEL (first in the chain) set the pod's lo down. The
	// fast path would still carry the sidecar's data over it, but not the
	// FINs: the sockets of these connections would never close, and would
	// keep the fast path's sockhash alive after the test. A pod's lo stays
	// up while its processes run, so put it back.
	if out, err := e.Pod.Exec("ip", "link", "set", "lo", "up"); err != nil {
		t.Fatalf("lo up after DEL: %v\n%s", err, out)
	}
	// The connections open at DEL keep going through the sidecar.
	pingPong(t, out, 20, randomLine(3000), outPrefix)
	pingPong(t, in, 20, randomLine(3000), inPrefix)
	// A new one is not captured any more, either way.
	interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "")
	interceptExpect(t, e, e.Remote, pod, "app", ie.RemoteV4.String(), "")
	interceptQuery(t, e, dns, "remote-dns:")
	if st := captureStatus(t, h); st.Pods != 0 {
		t.Fatalf("after DEL, %d pods registered, want 0", st.Pods)
	}
	if out, err := e.Pod.Exec("tc", "filter", "show", "dev", "mwti0", "ingress"); err != nil || strings.Contains(out, "meshwire") {
		t.Fatalf("after DEL, the pod's interface still has an inbound filter (%v):\n%s", err, out)
	}
	assertNoNetfilter(t, e.Pod)
}

// TestInterceptEBPFFallback: on a node where the interception programs are
// not attached, an EBPF pod's ADD fails saying so and installs nothing;
// with "ebpf-fallback": "REDIRECT" in the config the pod gets REDIRECT's
// rules instead (its traffic goes through the sidecar both ways), CHECK
// agrees, and DEL removes them. iptables-init --ebpf-fallback does the
// same for an init container.
func TestInterceptEBPFFallback(t *testing.T) {
	h := harness.New(t)
	if st := captureStatus(t, h); st.Attached {
		t.Fatalf("the ebpf interception programs are attached before the test (%s)", st.PinDir)
	}
	e := ie.New(t, h)
	e.StartProxy(false)
	clean := interceptRuleState(t, e, "nft")
	annotations := map[string]string{
		"sidecar.istio.io/status":    `{"containers":["istio-proxy"]}`,
		"intercept.meshwire.io/mode": "EBPF",
	}
	attach := func(name, extra string) *harness.Attachment {
		list := h.ConfList(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"loopback"},
			{"type":"intercept","istio-service-cidr":"*","istio-inbound-ports":"*"%s,
			 "capabilities":{"io.kubernetes.cri.pod-annotations":true}}]}`, name, extra))
		return ie.PodAttach(h, list, e.Pod, "shop", annotations)
	}
	// loopback's DEL sets lo down; the pod keeps using it.
	relo := func() {
		t.Helper()
		if out, err := e.Pod.Exec("ip", "link", "set", "lo", "up"); err != nil {
			t.Fatalf("lo up: %v %s", err, out)
		}
	}
	remote, pod := ie.AP(ie.RemoteV4, ie.RemotePort), ie.AP(ie.PodV4, ie.AppPort)

	a := attach("mwti-ebpf-nofallback", "")
	if _, err := a.Add(); err == nil || !strings.Contains(err.Error(), "not attached") {
		t.Fatalf("ADD without the programs: %v; want an error saying they are not attached", err)
	}
	if got := interceptRuleState(t, e, "nft"); got != clean {
		t.Fatalf("a failed EBPF ADD changed the namespace:\n%s", got)
	}
	if err := a.Del(); err != nil {
		t.Fatalf("DEL after the failed ADD: %v", err)
	}
	relo()

	a = attach("mwti-ebpf-fallback", `,"ebpf-fallback":"REDIRECT"`)
	a.MustAdd()
	if err := a.Check(); err != nil {
		t.Fatalf("CHECK of the fallback: %v", err)
	}
	if !strings.Contains(interceptRuleState(t, e, "nft"), "ISTIO_OUTPUT") {
		t.Fatal("no REDIRECT rules after the fallback ADD")
	}
	interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "outbound")
	interceptExpect(t, e, e.Remote, pod, "app", "127.0.0.6", "inbound")
	if err := a.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	relo()
	if got := interceptRuleState(t, e, "nft"); got != clean {
		t.Fatalf("rules left after DEL:\n%s", got)
	}

	if code, out := e.IptablesInit("-m", "EBPF", "--ebpf-fallback", "REDIRECT", "-i", "*", "-b", "*"); code != 0 || !strings.Contains(out, "--ebpf-fallback") {
		t.Fatalf("iptables-init -m EBPF --ebpf-fallback REDIRECT: exit %d\n%s", code, out)
	}
	interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "outbound")
	if code, out := e.IptablesInit("--cleanup-only"); code != 0 {
		t.Fatalf("--cleanup-only: exit %d\n%s", code, out)
	}
	if got := interceptRuleState(t, e, "nft"); got != clean {
		t.Fatalf("rules left after --cleanup-only:\n%s", got)
	}
}
