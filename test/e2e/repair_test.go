//go:build kernel

package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// TestNodeAgentRepairsDrift: a pod meshed by the chained intercept plugin
// (Istio's annotations, as containerd passes them) loses its interception,
// first while the node agent is down (iptables-init --cleanup-only in the
// pod: every rule and the policy routing; its traffic escapes the
// sidecar), then while the agent runs (`nft flush ruleset` in the pod).
// Each time the agent, within an interval or two, finds the drift by the
// pod's CHECK and repeats its ADD: CHECK passes again, the traffic goes
// through the sidecar, the repair is counted in /metrics. DEL removes the
// pod's record.
func TestNodeAgentRepairsDrift(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	e := ie.New(t, h)
	e.StartProxy(false)
	list := h.ConfList(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwti-repair","plugins":[{"type":"loopback"},
		{"type":"intercept","istio-service-cidr":"*","istio-inbound-ports":"*","dual-stack":true,
		 "capabilities":{%q:true}}]}`, "io.kubernetes.cri.pod-annotations"))
	a := ie.PodAttach(h, list, e.Pod, "shop", map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`})
	a.MustAdd()
	delDone := false
	t.Cleanup(func() {
		if !delDone {
			_ = a.Del()
		}
	})
	store := podstate.New(nodelayout.Default())
	record := podstate.Name(a.RT.ContainerID, "lo")
	if r, ok, err := store.Read(record); err != nil || !ok || r.Call == nil {
		t.Fatalf("ADD recorded no call for the node agent: %+v %v %v", r, ok, err)
	}
	remote := ie.AP(ie.RemoteV4, ie.RemotePort)
	interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "outbound")

	// Drift while the agent is down: every rule and the policy routing
	// removed in the pod; its traffic escapes the sidecar.
	if out, err := e.Pod.Exec(filepath.Join(h.BinDir, "iptables-init"), "--cleanup-only"); err != nil {
		t.Fatalf("iptables-init --cleanup-only in the pod: %v: %s", err, out)
	}
	if err := a.Check(); err == nil {
		t.Fatal("CHECK passes with the pod's rules removed: the drift is not seen")
	}
	interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "")

	n := newAgentNode(t)
	cmd := exec.Command(filepath.Join(h.BinDir, "meshwire"), "node", "--cni-bin-dir", n.binDir, "--cni-conf-dir", n.confDir,
		"--chain", "--listen", n.addr, "--interval", "500ms")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	waitUntil(t, 10*time.Second, "/healthz", func() bool { return probeCode(n.addr, "/healthz") == 200 })
	repaired := func(n agentNode, what string, count float64) {
		t.Helper()
		waitUntil(t, 10*time.Second, "the agent's repair after "+what, func() bool {
			if cmd.ProcessState != nil || probeCode(n.addr, "/healthz") != 200 {
				t.Fatalf("the agent is not serving:\n%s", stderr.String())
			}
			return scrape(t, n.addr)["meshwire_intercept_repairs_total"] == count && a.Check() == nil
		})
		interceptExpect(t, e, e.Pod, remote, "remote", ie.PodV4.String(), "outbound")
	}
	repaired(n, "the rules went while the agent was down", 1)

	// Drift while it runs: the pod's whole nftables ruleset flushed.
	if out, err := e.Pod.Exec("nft", "flush", "ruleset"); err != nil {
		t.Fatalf("nft flush ruleset in the pod: %v: %s", err, out)
	}
	repaired(n, "nft flush ruleset", 2)
	if m := scrape(t, n.addr); m["meshwire_intercept_pods"] < 1 || m["meshwire_intercept_repair_failures_total"] != 0 {
		t.Fatalf("metrics: pods %v, failures %v\n%s", m["meshwire_intercept_pods"], m["meshwire_intercept_repair_failures_total"], stderr.String())
	}
	if err := a.Del(); err != nil {
		t.Fatal(err)
	}
	delDone = true
	if store.Exists(record) {
		t.Fatal("DEL left the pod's record")
	}
}
