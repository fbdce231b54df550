//go:build kernel

package e2e

import (
	"net"
	"path/filepath"
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
	if err := ie.NoNetfilter(ns); err != nil {
		t.Fatal(err)
	}
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

// TestInterceptEBPFHiddenBPFFS: iptables-init -m EBPF run where the host's
// bpffs is not visible (`ip netns exec` remounts /sys, as a pod without
// the hostPath) says exactly that and how to fix it, not that the
// programs are not attached; run with the host's mounts (nsenter) it
// registers the pod.
func TestInterceptEBPFHiddenBPFFS(t *testing.T) {
	h := harness.New(t)
	interceptEBPFAttach(t, h)
	h.CheckNoLeaks()
	ns := h.NewNS("bpffs")
	bin := filepath.Join(h.BinDir, "iptables-init")
	out, err := ns.Exec(bin, "-m", "EBPF", "-i", "*", "-b", "*")
	if err == nil {
		t.Fatalf("iptables-init -m EBPF under ip netns exec succeeded:\n%s", out)
	}
	for _, want := range []string{"not on a bpf file system", "ip netns exec", "nsenter", "hostPath", "mount -t bpf"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the error does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not attached on this node") {
		t.Fatalf("the error says the programs are not attached, which they are:\n%s", out)
	}
	for _, args := range [][]string{{"-m", "EBPF", "-i", "*", "-b", "*"}, {"--cleanup-only"}} {
		if out, err := harness.Run("nsenter", append([]string{"--net=" + ns.Path, bin}, args...)...); err != nil {
			t.Fatalf("iptables-init %q with the host's mounts: %v\n%s", args, err, out)
		}
	}
}

// TestInterceptIPv6DecisionEBPF: EBPF mode takes TestInterceptIPv6Decision's
// decision too. In a pod whose first address is IPv4, without dual stack,
// the rules have no IPv6 half, and EBPF mode leaves IPv6 alone both ways
// (the app answers the remote directly, the proxy sees nothing), where it
// used to capture it: inbound, the proxy then could not reach the app
// from ::6, which only dual stack puts on lo, and the client was reset.
// IPv4 is captured both ways; with dual stack, IPv6 too
// (TestInterceptTraffic's EBPF mode).
func TestInterceptIPv6DecisionEBPF(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	interceptEBPFAttach(t, h)
	e := ie.New(t, h)
	e.StartProxy(false)
	if code, out := e.IptablesInitEnv([]string{"ISTIO_DUAL_STACK=false"}, "-m", "EBPF", "-i", "*", "-b", "*", "--reconcile"); code != 0 {
		t.Fatalf("iptables-init -m EBPF without dual stack: exit %d\n%s", code, out)
	}
	for _, fam := range interceptFamilies {
		pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
		out, in, peer := "outbound", "inbound", interceptPassthrough(fam.v6)
		if fam.v6 {
			out, in, peer = "", "", remote.String()
		}
		interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), out)
		interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", peer, in)
	}
	e.MustIptablesInit("--cleanup-only")
}
