//go:build kernel

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// fourStoresCommit is the last meshwire that kept a pod's state in four
// stores (the intercept plugin's calls, its fast-path records, its records
// of the pods' namespaces, the agent's enrolled pods), which
// TestUpgradeNodeState builds from this repository's history.
const fourStoresCommit = "298ae6a50fa286c41e8f11244d21b24fc72c144a"

// oldBuild builds the binaries of fourStoresCommit as `make build` builds
// them, once per bin directory (kept under its test/ directory when
// MESHWIRE_BIN_DIR names one), and returns their directory.
func oldBuild(t *testing.T, h *harness.H) string {
	t.Helper()
	dir := filepath.Join(h.BinDir, "test", "four-stores-"+fourStoresCommit[:12])
	if _, err := os.Stat(filepath.Join(dir, ".built")); err == nil {
		return dir
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, fourStoresCommit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("the sources of %s from git: %v\n%s", fourStoresCommit, err, out)
	}
	build := exec.Command("make", "--no-print-directory", "build", "BIN="+dir)
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", fourStoresCommit, err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, ".built"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startUpgradeAgent starts the agent of the meshwire binary bin as its
// DaemonSet runs it on a node with ambient mode on: it installs its
// plugins into the node's CNI directories (n), attaches the fast path,
// and enrolls pods by their annotation (no API server), in namespace ns
// (the node's, where its host rule goes), with the node's default state
// directory.
func startUpgradeAgent(t *testing.T, bin string, ns *harness.NS, n agentNode, zsock string) *ambientNode {
	t.Helper()
	a := startAgent(t, bin, ns, n, "--fastpath", "--ambient", "--ztunnel-socket", zsock, "--ambient-backend", "iptables-nft")
	waitUntil(t, 30*time.Second, "the agent ready (plugins installed, fast path attached)", func() bool {
		listening := ns.Do(func() error {
			c, err := net.DialTimeout("tcp", a.addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}) == nil
		return listening && a.metric("meshwire_node_ready") == "1"
	})
	return a
}

// TestUpgradeNodeState upgrades a node in place from the layout of four
// stores: the agent and plugins of fourStoresCommit set up pods of each
// kind (a sidecar pod REDIRECTed with the fast path's policy, a pod in
// EBPF mode, a pod enrolled in ambient mode), the agent is replaced by
// this build's (a DaemonSet rollout: it installs its plugins over the old
// ones), and the pods keep working: the old stores are moved into one
// record per pod, the fast path's policies are restored from them,
// ztunnel gets the ambient pod in the new agent's snapshot, the traffic
// of each pod goes where it went, drift is repaired from the moved call,
// and each pod's DEL by this build's plugin leaves nothing behind.
func TestUpgradeNodeState(t *testing.T) {
	h := harness.New(t)
	if st := fastpathStatus(t, h); st.Attached {
		t.Fatalf("the fast path is attached before the test (%s)", st.PinDir)
	}
	old := oldBuild(t, h)
	l := nodelayout.Default()
	store := podstate.New(l)
	h.CheckNoLeaks()
	// Runs before the leak check: the agent leaves its ambient socket
	// (the plugin then knows ambient mode is on); an agent run without
	// --ambient removes it, as this does.
	t.Cleanup(func() { _ = os.Remove(l.AgentSocket()) })
	t.Cleanup(func() {
		if fastpathStatus(t, h).Attached {
			fastpathDetach(t, h)
		}
	})

	side, ebpf, amb := ie.New(t, h), ie.New(t, h), ie.New(t, h)
	side.StartProxy(false)
	ebpf.StartProxy(false)
	n := newAgentNode(t)
	// The runtime runs whatever the node's CNI directory holds: the old
	// plugins, then (after the new agent installed them) this build's.
	rt := libcni.NewCNIConfigWithCacheDir([]string{n.binDir}, h.CacheDir, nil)
	zsock := filepath.Join(t.TempDir(), "ztunnel.sock")

	agent := startUpgradeAgent(t, filepath.Join(old, "meshwire"), amb.Remote, n, zsock)
	zt := amb.StartZtunnel(zsock, "-hbone", "0", "-dns", "0")
	waitUntil(t, 10*time.Second, "ztunnel connected", func() bool { return agent.metric("meshwire_ambient_ztunnels_connected") == "1" })

	list := h.ConfList(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwtug-state","plugins":[{"type":"loopback"},
		{"type":"intercept","istio-service-cidr":"*","istio-inbound-ports":"*","capabilities":{%q:true}}]}`, "io.kubernetes.cri.pod-annotations"))
	sidecar := `{"containers":["istio-proxy"]}`
	pods := map[string]*harness.Attachment{}
	for _, p := range []struct {
		name        string
		env         *ie.Env
		annotations map[string]string
	}{
		{"side", side, map[string]string{"sidecar.istio.io/status": sidecar}},
		{"ebpf", ebpf, map[string]string{"sidecar.istio.io/status": sidecar, "intercept.meshwire.io/mode": "EBPF"}},
		{"amb", amb, map[string]string{"istio.io/dataplane-mode": "ambient"}},
	} {
		a := h.Attach(list, p.env.Pod, "lo", map[string]any{"io.kubernetes.cri.pod-annotations": p.annotations})
		a.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", p.name}, {"K8S_POD_UID", "uid-" + p.name}, {"K8S_POD_INFRA_CONTAINER_ID", a.RT.ContainerID}}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := rt.AddNetworkList(ctx, list, a.RT)
		cancel()
		if err != nil {
			t.Fatalf("ADD of %s by the old plugin: %v\n%s", p.name, err, agent.stderr.String())
		}
		pods[p.name] = a
	}
	// The old layout, as the old build wrote it.
	name := func(p string) string { return podstate.Name(pods[p].RT.ContainerID, "lo") }
	for _, f := range []string{
		filepath.Join(l.LegacyCalls(), name("side")), filepath.Join(l.LegacyFastpath(), name("side")),
		filepath.Join(l.LegacyCalls(), name("ebpf")), filepath.Join(l.LegacyFastpath(), name("ebpf")),
		filepath.Join(l.Pods(), name("amb")), filepath.Join(l.LegacyEnrolled(), name("amb")),
	} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("the old build did not write %s: %v", f, err)
		}
	}
	remote := ie.AP(ie.RemoteV4, ie.RemotePort)
	ambientOutbound := func(what string) {
		t.Helper()
		mark := requestVia(t, zt, amb.Pod, remote, "remote", ie.PodV4.String())
		for _, r := range zt.Since(mark) {
			if r.Event == "conn" && r.Listener == "outbound" && r.Workload == "uid-amb" && r.OrigDst == remote.String() {
				return
			}
		}
		t.Fatalf("%s: the ambient pod's request did not go through ztunnel: %+v", what, zt.Since(mark))
	}
	interceptExpect(t, side, side.Pod, remote, "remote", ie.PodV4.String(), "outbound")
	interceptExpect(t, ebpf, ebpf.Pod, remote, "remote", ie.PodV4.String(), "outbound")
	ambientOutbound("before the upgrade")

	// The rollout: the old agent stops (it detaches the fast path), the
	// new one starts on the same node.
	_ = agent.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-agent.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("the old agent did not stop on SIGTERM")
	}
	mark := zt.Mark()
	agent = startUpgradeAgent(t, filepath.Join(h.BinDir, "meshwire"), amb.Remote, n, zsock)

	t.Run("records moved", func(t *testing.T) {
		recs, err := store.List()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"side", "ebpf"} {
			r := recs[name(p)]
			if r.Call == nil || r.Fastpath == nil || r.Fastpath.Mirror == nil || r.Check() != nil {
				t.Errorf("%s's record: %+v", p, r)
			}
		}
		if r := recs[name("amb")]; r.Ambient == nil || r.Key() != "shop/amb" || r.Check() != nil {
			t.Errorf("the ambient pod's record: %+v", r)
		}
		for _, d := range l.Legacy() {
			if entries, err := os.ReadDir(d); len(entries) > 0 {
				t.Errorf("%s still holds %d files (%v)", d, len(entries), err)
			}
		}
	})
	t.Run("fast path restored", func(t *testing.T) {
		if st := fastpathStatus(t, h); !st.Attached || st.PodPolicies != 2 {
			t.Fatalf("fast path: attached %v with %d pod policies, want 2 (the sidecar and EBPF pods')\n%s", st.Attached, st.PodPolicies, agent.stderr.String())
		}
		if !strings.Contains(agent.stderr.String(), "restored the fast-path policies of 2 meshed pods") {
			t.Errorf("the agent does not say it restored the policies:\n%s", agent.stderr.String())
		}
	})
	t.Run("traffic", func(t *testing.T) {
		interceptExpect(t, side, side.Pod, remote, "remote", ie.PodV4.String(), "outbound")
		interceptExpect(t, ebpf, ebpf.Pod, remote, "remote", ie.PodV4.String(), "outbound")
		if _, ok := zt.Await(func(r ie.Record) bool { return r.Workload == "uid-amb" && (r.Event == "add" || r.Event == "held") }, 15*time.Second); !ok {
			t.Fatalf("the new agent's snapshot did not hand ztunnel the ambient pod: %+v", zt.Since(mark))
		}
		if got := agent.metric("meshwire_ambient_enrolled_pods"); got != "1" {
			t.Fatalf("enrolled pods after the upgrade: %q", got)
		}
		ambientOutbound("after the upgrade")
	})
	t.Run("drift repaired from the moved call", func(t *testing.T) {
		// repairs: the agent's log lines of repairs of pod p's
		// interception.
		repairs := func(p string) []string {
			var found []string
			for _, l := range strings.Split(agent.stderr.String(), "\n") {
				if strings.Contains(l, "repaired the pod's interception") && strings.Contains(l, pods[p].RT.ContainerID) {
					found = append(found, l)
				}
			}
			return found
		}
		rounds := func() int {
			n, _ := strconv.Atoi(agent.metric("meshwire_intercept_check_rounds_total"))
			return n
		}
		// A whole round of the agent's checks started now, with this
		// build's plugin in place (the agent is ready): the sidecar pod
		// is as the old build left it, healthy, and is not repaired. The
		// EBPF pod's entry is the earlier build's, which captured the
		// pod's IPv6 (before pods.FlagIPv4Only): it is repaired once, for
		// that reason and no other.
		r0 := rounds()
		waitUntil(t, 15*time.Second, "a round of the agent's checks", func() bool { return rounds() >= r0+2 })
		if r := repairs("side"); len(r) > 0 {
			t.Errorf("the new agent repaired the healthy sidecar pod before any drift:\n%s", strings.Join(r, "\n"))
		}
		if r := repairs("ebpf"); len(r) != 1 || !strings.Contains(r[0], "an earlier build's: it captures the pod's IPv6") {
			t.Errorf("the EBPF pod's repairs before any drift: %q; want one, of the earlier build's entry", r)
		}
		for m, want := range map[string]string{"meshwire_intercept_repairs_total": "1", "meshwire_intercept_repair_failures_total": "0", "meshwire_intercept_check_errors_total": "0"} {
			if got := agent.metric(m); got != want {
				t.Errorf("%s before any drift: %s, want %s", m, got, want)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		if out, err := side.Pod.Exec(filepath.Join(h.BinDir, "iptables-init"), "--cleanup-only"); err != nil {
			t.Fatalf("iptables-init --cleanup-only in the sidecar pod: %v: %s", err, out)
		}
		waitUntil(t, 15*time.Second, "the agent's repair", func() bool { return len(repairs("side")) > 0 })
		if got := agent.metric("meshwire_intercept_repairs_total"); got != "2" || len(repairs("ebpf")) != 1 {
			t.Fatalf("repairs after the drift of the sidecar pod alone: %s in all (want 2), the EBPF pod's %q", got, repairs("ebpf"))
		}
		interceptExpect(t, side, side.Pod, remote, "remote", ie.PodV4.String(), "outbound")
	})

	// Each pod's DEL, by this build's plugin (the runtime runs what the
	// node's directory holds now), removes its record and what it made.
	for _, p := range []string{"side", "ebpf", "amb"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := rt.DelNetworkList(ctx, list, pods[p].RT)
		cancel()
		if err != nil {
			t.Fatalf("DEL of %s by the new plugin: %v", p, err)
		}
		if store.Exists(name(p)) {
			t.Fatalf("DEL of %s left its record", p)
		}
	}
	if _, ok := zt.Await(func(r ie.Record) bool { return r.Workload == "uid-amb" && r.Event == "del" }, 15*time.Second); !ok {
		t.Fatal("ztunnel was not told the ambient pod is gone")
	}
	if got := agent.metric("meshwire_ambient_enrolled_pods"); got != "0" {
		t.Fatalf("enrolled pods after the DELs: %q", got)
	}
	if st := fastpathStatus(t, h); st.PodPolicies != 0 {
		t.Fatalf("%d fast-path policies left after the DELs", st.PodPolicies)
	}
	agent.stop()
	if !strings.Contains(agent.stderr.String(), "host probe rule removed") {
		t.Fatalf("the new agent stopped without removing the host's probe rule:\n%s", agent.stderr.String())
	}
}
