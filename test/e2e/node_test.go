//go:build kernel

package e2e

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/installer"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// scrape reads the agent's /metrics with Prometheus' parser and returns
// the value of each unlabelled sample, and of labelled ones under
// name{l1="v1",...} in the order the agent writes them.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.Metric {
			key := name
			if len(m.Label) > 0 {
				var ls []string
				for _, l := range m.Label {
					ls = append(ls, l.GetName()+"="+l.GetValue())
				}
				key += "{" + strings.Join(ls, ",") + "}"
			}
			out[key] = sampleValue(m)
		}
	}
	return out
}

func sampleValue(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// agentNode is what a node agent under test works on: CNI directories with
// flannel's config as the primary one, and a free address for its
// endpoints.
type agentNode struct {
	binDir, confDir, conf string
	orig                  []byte // the config as flannel wrote it
	addr                  string
}

func newAgentNode(t *testing.T) agentNode {
	t.Helper()
	n := agentNode{binDir: t.TempDir(), confDir: t.TempDir(), orig: installFixture(t, "10-flannel.conflist")}
	n.conf = filepath.Join(n.confDir, "10-flannel.conflist")
	if err := os.WriteFile(n.conf, n.orig, 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.addr = ln.Addr().String()
	ln.Close()
	return n
}

func probeCode(addr, path string) int {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestNodeAgent runs `meshwire node` as the DaemonSet does (chained into
// flannel's config, the fast path, the plugins' log) and checks what it
// promises: ready once the plugins are installed, the config chained and
// the fast path attached; the plugins' calls and errors in /metrics, as
// the plugins logged them; the fast path attached again within an interval
// after someone detaches it, its counters moving with accelerated traffic;
// and on SIGTERM, with an accelerated connection open, the config restored,
// the fast path detached, the agent gone at once and the connection working
// after it.
func TestNodeAgent(t *testing.T) {
	h := harness.New(t)
	if st := fastpathStatus(t, h); st.Attached {
		t.Fatalf("the fast path is attached before the test (%s)", st.PinDir)
	}
	e := redirectedPod(t, h)

	n := newAgentNode(t)
	binDir, confDir, conf, orig, addr := n.binDir, n.confDir, n.conf, n.orig, n.addr
	logFile := filepath.Join(t.TempDir(), "cni.log")
	cmd := exec.Command(filepath.Join(h.BinDir, "meshwire"), "node", "--cni-bin-dir", binDir, "--cni-conf-dir", confDir,
		"--chain", "--cleanup-on-exit", "--fastpath", "--plugin-log", logFile, "--listen", addr,
		"--interval", "200ms")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if fastpath.IsAttached(fastpath.DefaultPinDir) {
			fastpathDetach(t, h)
		}
	})
	waitUntil(t, 10*time.Second, "/readyz ready", func() bool { return probeCode(addr, "/readyz") == 200 })
	if code := probeCode(addr, "/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	if b, _ := os.ReadFile(conf); !installer.HasMarker(b) || !bytes.Contains(b, []byte(`"log":{"file":"`+logFile+`"}`)) {
		t.Fatalf("config not chained with the plugin log:\n%s", b)
	}
	m := scrape(t, addr)
	for name, want := range map[string]float64{"meshwire_node_ready": 1, "meshwire_fastpath_attached": 1, "meshwire_fastpath_attaches_total": 1, "meshwire_installer_config_applied": 1} {
		if m[name] != want {
			t.Errorf("%s = %v, want %v", name, m[name], want)
		}
	}

	// Plugin calls as a runtime makes them, with the log object the
	// agent chains: one that succeeds, one that fails.
	logObj := `"log":{"file":"` + logFile + `"}`
	ns := h.NewNS("node")
	h.Attach(h.Single("1.1.0", "mwt-node-lo", `{"type":"loopback",`+logObj+`}`), ns, "lo", nil).MustAdd()
	if _, err := h.Attach(h.Single("1.1.0", "mwt-node-bad", `{"type":"bandwidth","ingressRate":-1,`+logObj+`}`), ns, "eth0", nil).Add(); err == nil {
		t.Fatal("bandwidth with a negative rate succeeded")
	}
	m = scrape(t, addr)
	if v := m["meshwire_cni_calls_total{plugin=loopback,command=ADD,result=ok}"]; v != 1 {
		t.Errorf("loopback ADD counted %v times:\n%v", v, m)
	}
	errs := 0.0
	for k, v := range m {
		if strings.HasPrefix(k, "meshwire_cni_errors_total{plugin=bandwidth,command=ADD,") {
			errs += v
		}
	}
	if errs != 1 {
		t.Errorf("bandwidth's failed ADD counted %v times:\n%v", errs, m)
	}

	// Someone detaches the fast path: the agent attaches it again.
	fastpathDetach(t, h)
	waitUntil(t, 5*time.Second, "the fast path attached again", func() bool { return scrape(t, addr)["meshwire_fastpath_attaches_total"] == 2 })
	waitUntil(t, 5*time.Second, "/readyz ready again", func() bool { return probeCode(addr, "/readyz") == 200 })
	if !strings.Contains(stderr.String(), "detached by someone else; attached it again") {
		t.Errorf("log does not say the fast path was attached again:\n%s", stderr.String())
	}

	// A pod registered for ebpf interception whose namespace goes
	// without a DEL is forgotten after two sweeps (6 intervals apart).
	goneName := "mwt-node-gone-" + harness.RandomID()[:8]
	gonePath, err := netns.Create(goneName)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = netns.Delete(goneName) }()
	goneNS := &harness.NS{Name: goneName, Path: gonePath}
	if code, out := e.IptablesInitIn(goneNS, nil, "-m", "EBPF", "-i", "*", "-b", "*"); code != 0 {
		t.Fatalf("iptables-init -m EBPF: exit %d: %s", code, out)
	}
	if st := captureStatus(t, h); st.Pods != 1 {
		t.Fatalf("%d pods registered, want 1", st.Pods)
	}
	// Its fast-path policy too, as the chained plugin writes it.
	policies := scrape(t, addr)["meshwire_fastpath_pod_policies"]
	if err := netns.Enter(gonePath, func() error {
		_, err := podpolicy.Set("", podpolicy.Policy{IntoProxy: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // sweeps while the namespace is there
	if m := scrape(t, addr); m["meshwire_capture_pods"] != 1 || m["meshwire_capture_collected_total"] != 0 ||
		m["meshwire_fastpath_pod_policies"] != policies+1 || m["meshwire_fastpath_policies_collected_total"] != 0 {
		t.Fatalf("a live pod's registration or policy was collected: %v", m)
	}
	if err := netns.Delete(goneName); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the registration and policy of the gone namespace forgotten", func() bool {
		m := scrape(t, addr)
		return m["meshwire_capture_collected_total"] == 1 && m["meshwire_capture_pods"] == 0 &&
			m["meshwire_fastpath_policies_collected_total"] == 1 && m["meshwire_fastpath_pod_policies"] == policies
	})
	for _, want := range []string{"collected the ebpf interception registration of a pod whose namespace is gone", "collected the fast-path policy of a pod whose namespace is gone"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("log does not say %q:\n%s", want, stderr.String())
		}
	}

	// An accelerated connection, open across SIGTERM.
	remote := ie.AP(ie.RemoteV4, ie.RemotePort)
	prefix := "remote " + ie.PodV4.String() + " "
	live, err := ie.Dial(e.Pod, remote)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	pingPong(t, live, 10, randomLine(1000), prefix)
	if m := scrape(t, addr); m["meshwire_fastpath_redirected_messages_total"] == 0 || m["meshwire_fastpath_sockets"] == 0 {
		t.Fatalf("the connection is not on the fast path: %v", m)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if exitErr != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", exitErr, stderr.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("still running 5s after SIGTERM:\n%s", stderr.String())
	}
	if fastpath.IsAttached(fastpath.DefaultPinDir) {
		t.Fatal("the fast path is still attached after the agent stopped")
	}
	if b, _ := os.ReadFile(conf); !bytes.Equal(b, orig) {
		t.Fatalf("config not restored:\n%s", b)
	}
	if log := stderr.String(); !strings.Contains(log, "detached the fast path; 2 sockets keep it until they close") {
		t.Errorf("log:\n%s", log)
	}
	// The connection outlives the agent; the sockhash goes with it.
	pingPong(t, live, 10, randomLine(70000), prefix)
	live.Close()
	waitSockhashFreed(t)
	t.Logf("log:\n%s", stderr.String())
}
