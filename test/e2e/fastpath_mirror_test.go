//go:build kernel

package e2e

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// mirrored reads the fast path's copy of the interception settings of the
// pod in ns.
func mirrored(t *testing.T, ns *harness.NS) (pods.Capture, bool) {
	t.Helper()
	var c pods.Capture
	var ok bool
	err := netns.Enter(ns.Path, func() error {
		var err error
		c, ok, err = pods.Registered(loader.RulesDir(""))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return c, ok
}

// TestFastpathTracksCapturedOnly: for an Istio pod set up by the chained
// intercept plugin, the fast path tracks only the application connections
// the pod's interception captures (the plugin copies its settings beside
// the policy): a connection to an excluded port or an excluded range goes
// straight to its destination and is never taken (no socket, no sk_msg
// program on its messages), while a captured one is paired. REDIRECT and
// EBPF mode; DEL removes the copy.
func TestFastpathTracksCapturedOnly(t *testing.T) {
	for _, mode := range fastpathModes {
		t.Run(mode, func(t *testing.T) {
			h := harness.New(t)
			fastpathAttach(t, h)
			e := ie.New(t, h)
			e.StartProxy(false)
			a := ie.ChainedIntercept(h, "mwtfp-mirror", e.Pod, map[string]string{
				"sidecar.istio.io/status":                          istioStatus,
				"intercept.meshwire.io/mode":                       mode,
				"traffic.sidecar.istio.io/excludeOutboundPorts":    strconv.Itoa(ie.RemotePort2),
				"traffic.sidecar.istio.io/excludeOutboundIPRanges": ie.ExtraV4.String() + "/32",
			})
			a.MustAdd()
			deleted := false
			defer func() {
				if !deleted {
					_ = a.Del()
				}
			}()
			c, ok := mirrored(t, e.Pod)
			if !ok {
				t.Fatal("ADD left no copy of the pod's interception settings for the fast path")
			}
			if ebpf := c.Flags&pods.FlagEBPFMode != 0; ebpf != (mode == "EBPF") {
				t.Fatalf("the copy says EBPF mode %v in mode %s", ebpf, mode)
			}
			prefix := "remote " + ie.PodV4.String() + " "
			for _, dst := range []struct {
				name string
				to   netip.AddrPort
			}{
				{"excluded port", ie.AP(ie.RemoteV4, ie.RemotePort2)},
				{"excluded range", ie.AP(ie.ExtraV4, ie.RemotePort)},
			} {
				before := fastpathStatus(t, h).Counters
				conn, err := ie.Dial(e.Pod, dst.to)
				if err != nil {
					t.Fatal(err)
				}
				pingPong(t, conn, 3, randomLine(100), prefix)
				conn.Close()
				if got := fastpathStatus(t, h).Counters.Sub(before); got.Sockets != 0 {
					t.Errorf("%s: %d sockets taken, want none (%+v)", dst.name, got.Sockets, got)
				}
			}
			before := fastpathStatus(t, h).Counters
			conn, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, ie.RemotePort))
			if err != nil {
				t.Fatal(err)
			}
			pingPong(t, conn, 3, randomLine(100), prefix)
			conn.Close()
			if got := fastpathStatus(t, h).Counters.Sub(before); got.Pairs != 1 || got.Sockets != 2 {
				t.Fatalf("captured connection: %d pairs of %d sockets, want 1 of 2 (%+v)", got.Pairs, got.Sockets, got)
			}
			deleted = true
			if err := a.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if _, ok := mirrored(t, e.Pod); ok {
				t.Fatal("DEL left the fast path's copy of the pod's settings")
			}
			if out, err := e.Pod.Exec("ip", "link", "set", "lo", "up"); err != nil {
				t.Fatalf("lo up: %v %s", err, out)
			}
		})
	}
}

// TestFastpathPoliciesReplayed: the chained plugin records a meshed pod's
// fast-path policy and settings copy at ADD also with no fast path
// attached; attach (as the node agent's start does) restores them, and
// again after a detach (the agent's restart); DEL removes the record.
func TestFastpathPoliciesReplayed(t *testing.T) {
	h := harness.New(t)
	e := ie.New(t, h)
	e.StartProxy(false)
	a := ie.ChainedIntercept(h, "mwtfp-replay", e.Pod, map[string]string{
		"sidecar.istio.io/status":                       istioStatus,
		"traffic.sidecar.istio.io/excludeOutboundPorts": strconv.Itoa(ie.RemotePort2),
	})
	a.MustAdd()
	deleted := false
	defer func() {
		if !deleted {
			_ = a.Del()
		}
	}()
	// Detached however the test ends (a detach of nothing succeeds).
	t.Cleanup(func() { fastpathDetach(t, h) })
	store := podstate.New(nodelayout.Default())
	if r, ok, err := store.Read(podstate.Name(a.RT.ContainerID, a.RT.IfName)); err != nil || !ok || r.Fastpath == nil || r.Fastpath.Mirror == nil {
		t.Fatalf("ADD with no fast path attached left no record of the pod's policy and settings: %+v %v %v", r, ok, err)
	}
	for _, step := range []string{"attach after the pod's ADD", "attach again after a detach"} {
		if step != "attach after the pod's ADD" {
			fastpathDetach(t, h)
		}
		if code, out := fastpathCmd(t, h, "attach"); code != 0 || !strings.Contains(out, "policies restored") {
			t.Fatalf("%s: exit %d: %s", step, code, out)
		}
		if p, ok := podPolicy(t, e.Pod); !ok || !p.IntoProxy {
			t.Fatalf("%s: policy %+v (present %v), want the Istio pod's", step, p, ok)
		}
		if _, ok := mirrored(t, e.Pod); !ok {
			t.Fatalf("%s: no copy of the pod's interception settings", step)
		}
		// Both directions of a captured connection are carried: the
		// proxy is fed, as the restored policy says.
		before := fastpathStatus(t, h).Counters
		conn, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, ie.RemotePort))
		if err != nil {
			t.Fatal(err)
		}
		pingPong(t, conn, 5, randomLine(100), "remote "+ie.PodV4.String()+" ")
		conn.Close()
		if got := fastpathStatus(t, h).Counters.Sub(before); got.Pairs != 1 || got.KeptForProxy != 0 || got.RedirectedMessages < 8 {
			t.Fatalf("%s: %+v, want one pair carried both ways", step, got)
		}
	}
	deleted = true
	if err := a.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if store.Exists(podstate.Name(a.RT.ContainerID, a.RT.IfName)) {
		t.Fatal("DEL left the record")
	}
	if out, err := e.Pod.Exec("ip", "link", "set", "lo", "up"); err != nil {
		t.Fatalf("lo up: %v %s", err, out)
	}
}
