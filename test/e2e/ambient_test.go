//go:build kernel

package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// TestAmbient runs Istio's ambient mode end to end, on each backend: the
// node agent (`meshwire node --ambient`, without an API server: pods are
// enrolled by their own annotation) in the remote namespace, which is the
// pod's node; the intercept plugin chained as the runtime runs it; and the
// test proxy as ztunnel's stand-in, which takes the pod's namespace over
// ZDS and listens in it. It proves outbound and inbound capture with the
// original destinations, DNS to 15053, the node's probes let through by
// the host rule's SNAT, a pod that opts out left alone, a ztunnel restart
// replaying the snapshot, an agent restart keeping the pod, and DEL and
// the agent's stop leaving nothing.
func TestAmbient(t *testing.T) {
	// One harness: the namespaces of every backend's run go at the end,
	// and the host is compared once.
	h := harness.New(t)
	h.CheckNoLeaks()
	for _, backend := range []string{"iptables-nft", "iptables-legacy", "nftables"} {
		t.Run(backend, func(t *testing.T) { testAmbient(t, h, backend) })
	}
}

// ambientNode is a running node agent in ambient mode.
type ambientNode struct {
	t      *testing.T
	cmd    *exec.Cmd
	ns     *harness.NS
	addr   string
	stderr *syncBuffer
	exited chan struct{}
}

func startAmbientNode(t *testing.T, h *harness.H, ns *harness.NS, dir, backend string, flags ...string) *ambientNode {
	t.Helper()
	a := startAgent(t, filepath.Join(h.BinDir, "meshwire"), ns, newAgentNode(t),
		append([]string{"--ambient", "--node-state-dir", dir, "--ztunnel-socket", filepath.Join(dir, "ztunnel.sock"),
			"--ambient-backend", backend, "--ambient-dns-capture=false"}, flags...)...)
	waitUntil(t, 20*time.Second, "the agent's ambient socket", func() bool {
		_, err := os.Stat(filepath.Join(dir, "ambient", "agent.sock"))
		return err == nil
	})
	return a
}

// startAgent starts `meshwire node` of binary bin in namespace ns on
// node n (its CNI directories, its address; the agent installs its own
// intercept), with more flags, and kills it when the test ends (its log
// shown when the test failed).
func startAgent(t *testing.T, bin string, ns *harness.NS, n agentNode, flags ...string) *ambientNode {
	t.Helper()
	a := &ambientNode{t: t, ns: ns, addr: n.addr, stderr: &syncBuffer{}, exited: make(chan struct{})}
	a.cmd = exec.Command(bin, append([]string{"node", "--cni-bin-dir", n.binDir, "--cni-conf-dir", n.confDir,
		"--intercept", "--listen", n.addr, "--interval", "200ms"}, flags...)...)
	a.cmd.Stderr = a.stderr
	if err := ns.Do(a.cmd.Start); err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.cmd.Wait(); close(a.exited) }()
	t.Cleanup(func() {
		a.kill()
		if t.Failed() {
			t.Logf("the agent's log (%s):\n%s", bin, a.stderr.String())
		}
	})
	return a
}

func (a *ambientNode) kill() {
	_ = a.cmd.Process.Kill()
	<-a.exited
}

// stop sends SIGTERM and waits for the agent to exit.
func (a *ambientNode) stop() {
	a.t.Helper()
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(15 * time.Second):
		a.t.Fatalf("the agent did not stop on SIGTERM:\n%s", a.stderr.String())
	}
}

// metrics scrapes the agent's /metrics from inside its namespace.
func (a *ambientNode) metric(name string) string {
	a.t.Helper()
	var body string
	err := a.ns.Do(func() error {
		c, err := net.DialTimeout("tcp", a.addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var b strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			b.WriteString(sc.Text() + "\n")
		}
		body = b.String()
		return nil
	})
	if err != nil {
		a.t.Fatalf("scrape the agent: %v", err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

func testAmbient(t *testing.T, h *harness.H, backend string) {
	e := ie.New(t, h)
	peer := e.AddPeer()
	dir := t.TempDir()
	// The plugin finds the agent's socket and the records' directory
	// where this agent keeps them.
	t.Setenv(nodelayout.EnvNodeStateDir, dir)

	outer := t
	agent := startAmbientNode(t, h, e.Remote, dir, backend)
	ztunnel := func() *ie.Proxy {
		return e.StartZtunnel(filepath.Join(dir, "ztunnel.sock"), "-hbone", "0", "-dns-upstream", ie.AP(ie.RemoteV4, ie.DNSPort).String())
	}
	// seen waits for a record of the stand-in after mark.
	seen := func(p *ie.Proxy, mark int, what string, match func(ie.Record) bool) {
		t.Helper()
		waitUntil(t, 15*time.Second, what, func() bool {
			for _, r := range p.Since(mark) {
				if match(r) {
					return true
				}
			}
			return false
		})
	}
	zt := ztunnel()
	waitUntil(t, 10*time.Second, "ztunnel connected", func() bool { return agent.metric("meshwire_ambient_ztunnels_connected") == "1" })

	list := h.ConfList(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwamb-%s","plugins":[{"type":"loopback"},
		{"type":"intercept","capabilities":{%q:true}}]}`, backend, "io.kubernetes.cri.pod-annotations"))
	attach := func(uid string, annotations map[string]string) *harness.Attachment {
		a := h.Attach(list, e.Pod, "lo", map[string]any{"io.kubernetes.cri.pod-annotations": annotations})
		a.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "web"}, {"K8S_POD_UID", uid}, {"K8S_POD_INFRA_CONTAINER_ID", a.RT.ContainerID}}
		return a
	}
	remote, app := ie.AP(ie.RemoteV4, ie.RemotePort), ie.AP(ie.PodV4, ie.AppPort)
	probeSNAT := ambient.DefaultProbeSNAT.String()

	// request makes one request from ns to dst and checks the reply's
	// "who peer" and the stand-in's records: one on listener with
	// original destination dst, or none.
	request := func(from *harness.NS, dst netip.AddrPort, who, peerAddr, listener string) {
		t.Helper()
		mark := requestVia(t, zt, from, dst, who, peerAddr)
		var conns []ie.Record
		for _, r := range zt.Since(mark) {
			if r.Event == "conn" {
				conns = append(conns, r)
			}
		}
		if listener == "" {
			if len(conns) != 0 {
				t.Fatalf("request to %s from %s went through ztunnel: %+v", dst, from.Name, conns)
			}
			return
		}
		if len(conns) != 1 || conns[0].Listener != listener || conns[0].OrigDst != dst.String() || conns[0].Workload != "uid-web" {
			t.Fatalf("request to %s from %s: ztunnel saw %+v, want one on %s with original destination %s", dst, from.Name, conns, listener, dst)
		}
	}

	pod := attach("uid-web", map[string]string{"istio.io/dataplane-mode": "ambient", "ambient.istio.io/dns-capture": "true"})
	pod.MustAdd()
	if got := agent.metric("meshwire_ambient_enrolled_pods"); got != "1" {
		t.Fatalf("enrolled pods: %q, want 1\n%s", got, agent.stderr.String())
	}

	t.Run("outbound", func(t *testing.T) { request(e.Pod, remote, "remote", ie.PodV4.String(), "outbound") })
	t.Run("inbound", func(t *testing.T) { request(peer, app, "app", ie.PeerV4.String(), "inbound") })
	t.Run("probe", func(t *testing.T) {
		// The node's own connection (kubelet's probe) reaches the app
		// from the probe address, not through ztunnel.
		request(e.Remote, app, "app", probeSNAT, "")
	})
	t.Run("dns", func(t *testing.T) {
		mark := zt.Mark()
		reply, _, err := ie.Query(e.Pod, ie.Connected, ie.AP(ie.RemoteV4, ie.DNSPort), "q1")
		if err != nil || !strings.Contains(reply, "q1") {
			t.Fatalf("DNS query: %q, %v", reply, err)
		}
		found := false
		for _, r := range zt.Since(mark) {
			found = found || (r.Event == "dns" || r.Listener == "dns-udp")
		}
		if !found {
			t.Fatalf("the pod's DNS query did not go to ztunnel's 15053: %+v", zt.Since(mark))
		}
	})

	t.Run("ztunnel restart", func(t *testing.T) {
		zt.Stop()
		zt = ztunnel()
		seen(zt, 0, "the snapshot replayed to the new ztunnel", func(r ie.Record) bool { return r.Event == "add" && r.Workload == "uid-web" })
		request(e.Pod, remote, "remote", ie.PodV4.String(), "outbound")
	})

	t.Run("agent restart", func(t *testing.T) {
		agent.stop()
		// A stop without --cleanup-on-exit is a rollout's: the plugin's
		// socket stays, for the next agent.
		if _, err := os.Stat(filepath.Join(dir, "ambient", "agent.sock")); err != nil {
			t.Fatalf("the agent's stop for a rollout removed the plugin's socket: %v", err)
		}
		// The pod stays in the mesh while the agent is away.
		request(e.Pod, remote, "remote", ie.PodV4.String(), "outbound")
		mark := zt.Mark()
		// This one runs past this subtest, and its stop at the end is an
		// uninstall's.
		agent = startAmbientNode(outer, h, e.Remote, dir, backend, "--cleanup-on-exit")
		seen(zt, mark, "the restarted agent's snapshot", func(r ie.Record) bool { return r.Event == "held" && r.Workload == "uid-web" })
		if got := agent.metric("meshwire_ambient_enrolled_pods"); got != "1" {
			t.Fatalf("the restarted agent holds %q pods, want 1", got)
		}
		request(peer, app, "app", ie.PeerV4.String(), "inbound")
		request(e.Remote, app, "app", probeSNAT, "")
	})

	mark := zt.Mark()
	if err := pod.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	seen(zt, mark, "ztunnel told the pod is gone", func(r ie.Record) bool { return r.Event == "del" && r.Workload == "uid-web" })
	if got := agent.metric("meshwire_ambient_enrolled_pods"); got != "0" {
		t.Fatalf("enrolled pods after DEL: %q", got)
	}

	t.Run("opted out", func(t *testing.T) {
		relo(t, e)
		p := attach("uid-batch", map[string]string{"istio.io/dataplane-mode": "none"})
		p.MustAdd()
		request(e.Pod, remote, "remote", ie.PodV4.String(), "")
		request(peer, app, "app", ie.PeerV4.String(), "")
		if got := agent.metric("meshwire_ambient_enrolled_pods"); got != "0" {
			t.Fatalf("an opted-out pod is enrolled: %q", got)
		}
		if err := p.Del(); err != nil {
			t.Fatal(err)
		}
	})

	agent.stop()
	if !strings.Contains(agent.stderr.String(), "host probe rule removed") {
		t.Fatalf("the agent's stop with no pod enrolled did not remove the host rule:\n%s", agent.stderr.String())
	}
	ambientHostClean(t, e.Remote, backend)
	// Uninstalled (the config change taken back): no agent will answer
	// on the plugin's socket again.
	if _, err := os.Stat(filepath.Join(dir, "ambient", "agent.sock")); !os.IsNotExist(err) {
		t.Fatalf("the uninstalled agent left the plugin's socket (%v):\n%s", err, agent.stderr.String())
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "pods")); len(entries) != 0 {
		t.Fatalf("pod records (with their enrollments) left: %v", entries)
	}
}

// relo brings the pod's lo up again (the loopback plugin's DEL takes it
// down).
func relo(t *testing.T, e *ie.Env) {
	t.Helper()
	if out, err := e.Pod.Exec("ip", "link", "set", "lo", "up"); err != nil {
		t.Fatalf("lo up: %v %s", err, out)
	}
}

// ambientHostClean checks that the node holds no host rule and no probe
// set.
func ambientHostClean(t *testing.T, node *harness.NS, backend string) {
	t.Helper()
	var out string
	var err error
	if backend == "nftables" {
		out, err = node.Exec("nft", "list", "tables")
	} else {
		out, err = node.Exec("sh", "-c", backend+"-save -t nat; ipset list -n")
	}
	if err != nil {
		t.Fatalf("read the node's firewall: %v %s", err, out)
	}
	for _, s := range []string{"ISTIO", "istio"} {
		if strings.Contains(out, s) {
			t.Fatalf("the agent's stop left its host rule or sets:\n%s", out)
		}
	}
}
