//go:build kernel

package e2e

import (
	"testing"

	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// meshRemote makes the remote namespace a meshed pod of its own, in mode,
// with its own sidecar and the fast-path policy p (as the chained plugin
// writes it); the pod gets the same policy with its own NoPeer.
func meshRemote(t *testing.T, e *ie.Env, mode string, pod, remote podpolicy.Policy) {
	t.Helper()
	if code, out := e.IptablesInitIn(e.Remote, nil, "-m", mode, "-i", "*", "-b", "*"); code != 0 {
		t.Fatalf("iptables-init -m %s in the remote: exit %d: %s", mode, code, out)
	}
	if mode == "EBPF" {
		t.Cleanup(func() {
			if code, out := e.IptablesInitIn(e.Remote, nil, "--cleanup-only"); code != 0 {
				t.Errorf("iptables-init --cleanup-only in the remote: exit %d: %s", code, out)
			}
		})
	}
	e.StartProxyIn(e.Remote, ie.ProxyUID, ie.ProxyUID, mode == "TPROXY")
	for _, x := range []struct {
		ns *harness.NS
		p  podpolicy.Policy
	}{{e.Pod, pod}, {e.Remote, remote}} {
		err := netns.Enter(x.ns.Path, func() error {
			_, err := podpolicy.Set("", x.p)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestFastpathSidecarToSidecar: two meshed pods of one node, the app of
// one calling the other's: app -> sidecar -> the other pod's sidecar ->
// its app. The connection between the two sidecars is paired across the
// namespaces (PeerPairs), every byte of every size arrives intact both
// ways, IPv4 and IPv6, in REDIRECT and EBPF mode (where neither pod has a
// conntrack entry or a rule afterwards). A pod whose policy says NoPeer
// (a shaped pod) is never paired with the other, and its traffic works.
func TestFastpathSidecarToSidecar(t *testing.T) {
	fastpathEachMode(t, func(t *testing.T, mode string) *ie.Env {
		h := harness.New(t)
		fastpathAttach(t, h)
		e := interceptedPod(t, h, mode)
		meshed := podpolicy.Policy{IntoProxy: true}
		meshRemote(t, e, mode, meshed, meshed)
		for _, fam := range interceptFamilies {
			t.Run(fam.name, func(t *testing.T) {
				before := fastpathStatus(t, h)
				c, err := ie.Dial(e.Pod, ie.AP(ie.Remote(fam.v6), ie.RemotePort))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				prefix := "remote " + interceptPassthrough(fam.v6) + " "
				for _, n := range fastpathSizes {
					pingPong(t, c, 3, randomLine(n), prefix)
				}
				got := fastpathStatus(t, h).Counters.Sub(before.Counters)
				// Three connections: app -> sidecar, sidecar ->
				// sidecar, sidecar -> app; every message crosses
				// each of them once each way.
				if got.PeerPairs != 1 || got.Pairs != 3 {
					t.Fatalf("pairs %d, sidecar to sidecar %d; want 3 and 1 (%+v)", got.Pairs, got.PeerPairs, got)
				}
				if min := uint64(3 * 2 * 3 * len(fastpathSizes)); got.RedirectedMessages < min {
					t.Fatalf("redirected %d messages, want at least %d (%+v)", got.RedirectedMessages, min, got)
				}
			})
		}
		t.Run("shaped pod", func(t *testing.T) {
			meshRemoteNoPeer(t, e)
			before := fastpathStatus(t, h)
			c, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, ie.RemotePort))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			pingPong(t, c, 5, randomLine(4096), "remote 127.0.0.6 ")
			got := fastpathStatus(t, h).Counters.Sub(before.Counters)
			if got.PeerPairs != 0 || got.Pairs != 2 {
				t.Fatalf("pairs %d, sidecar to sidecar %d; want 2 (in each pod) and 0 (%+v)", got.Pairs, got.PeerPairs, got)
			}
		})
		return e
	})
}

// meshRemoteNoPeer gives the remote pod a policy that forbids pairing it
// with another pod (as for a pod with a bandwidth annotation).
func meshRemoteNoPeer(t *testing.T, e *ie.Env) {
	t.Helper()
	err := netns.Enter(e.Remote.Path, func() error {
		_, err := podpolicy.Set("", podpolicy.Policy{IntoProxy: true, NoPeer: true})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
