//go:build kernel

package istio

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/proxylog"
	"github.com/meshwire/meshwire/internal/zds"
	"github.com/meshwire/meshwire/test/harness"
)

// records reads a test proxy's JSON lines as they come.
type records struct {
	ch chan proxylog.Record
}

// startProc runs the test proxy binary with args (through `ip netns exec
// ns` when ns is not nil) and stops it at cleanup.
func startProc(t *testing.T, ns *harness.NS, bin string, args ...string) *records {
	t.Helper()
	if ns != nil {
		args = append([]string{"netns", "exec", ns.Name, bin}, args...)
		bin = "ip"
	}
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &records{ch: make(chan proxylog.Record, 256)}
	go func() {
		defer close(r.ch)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var rec proxylog.Record
			if json.Unmarshal(sc.Bytes(), &rec) == nil {
				r.ch <- rec
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("%s stderr:\n%s", filepath.Base(args[len(args)-1]), stderr.String())
		}
	})
	r.wait(t, "ready", func(rec proxylog.Record) bool { return rec.Event == "ready" })
	return r
}

// wait returns the first record that matches, failing on an error record
// or after five seconds.
func (r *records) wait(t *testing.T, what string, match func(proxylog.Record) bool) proxylog.Record {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case rec, ok := <-r.ch:
			if !ok {
				t.Fatalf("waiting for %s: the process ended", what)
			}
			if rec.Event == "error" {
				t.Fatalf("waiting for %s: %+v", what, rec)
			}
			if match(rec) {
				return rec
			}
		case <-timeout:
			t.Fatalf("no %s within 5s", what)
		}
	}
}

// TestZtunnelStandIn: a pod with Istio's ambient in-pod rules (meshwire's,
// applied through its firewall) and istio-cni's in-pod policy route; the
// node agent's ZDS server hands the pod's netns to the test proxy running
// as ztunnel (-zds). Outbound TCP from the pod reaches a server on the
// node through the stand-in's 15001 with its original destination, and
// inbound TCP from the node reaches the pod's app through 15006, on IPv4
// and IPv6. The stand-in reconnects to a restarted agent and keeps the
// pod, and DelWorkload takes its listeners away (the pod's outbound TCP
// then has nowhere to go). A second namespace stands for the node, so
// that the host is left untouched.
func TestZtunnelStandIn(t *testing.T) {
	h := harness.New(t)
	bin := filepath.Join(h.BinDir, "test", "proxy")
	node, pod := h.NewNS("zdsnode"), h.NewNS("zdspod")
	run := func(n *harness.NS, args ...string) {
		t.Helper()
		if out, err := n.Exec(args[0], args[1:]...); err != nil {
			t.Fatalf("%s: %q: %v\n%s", n.Name, args, err, out)
		}
	}
	run(pod, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "veth0", "netns", node.Name)
	for _, s := range []struct {
		n            *harness.NS
		link, a4, a6 string
	}{{pod, "eth0", "198.18.0.2/24", "fd42:6d77::2/64"}, {node, "veth0", "198.18.0.1/24", "fd42:6d77::1/64"}} {
		run(s.n, "ip", "addr", "add", s.a4, "dev", s.link)
		run(s.n, "ip", "addr", "add", s.a6, "dev", s.link, "nodad")
		run(s.n, "ip", "link", "set", s.link, "up")
		run(s.n, "ip", "link", "set", "lo", "up")
	}
	// istio-cni's in-pod routing (not built in meshwire yet): packets
	// whose connection ztunnel made (connmark 0x111, restored as mark)
	// are delivered locally, to ztunnel's transparent socket.
	for _, fam := range []string{"-4", "-6"} {
		run(pod, "ip", fam, "rule", "add", "fwmark", "0x111/0xfff", "pref", "32764", "lookup", "100")
		run(pod, "ip", fam, "route", "add", "local", "default", "dev", "lo", "table", "100")
	}
	cfg := ambient.Config{IPv6: true, ProbeSNAT: ambient.DefaultProbeSNAT, ProbeSNATv6: ambient.DefaultProbeSNATv6}
	err := pod.Do(func() error {
		fw := firewall.New(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT})
		defer fw.Close()
		return fw.Apply(context.Background(), ambient.InPodIPTables(cfg, ambient.Pod{}))
	})
	if err != nil {
		t.Fatalf("in-pod rules: %v", err)
	}

	const uid = "0d6c5f5e-zds-test"
	wl := zds.Workload{UID: uid, Name: "app", Namespace: "default", ServiceAccount: "default",
		Netns: func() (*os.File, error) { return os.Open(pod.Path) }}
	var mu sync.Mutex
	enrolled := []zds.Workload{wl}
	snapshot := func() []zds.Workload { mu.Lock(); defer mu.Unlock(); return append([]zds.Workload(nil), enrolled...) }
	sock := filepath.Join(t.TempDir(), "ztunnel.sock")
	agent := func() *zds.Server {
		s, err := zds.Listen(sock, snapshot, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- s.Serve(context.Background()) }()
		t.Cleanup(func() { s.Close(); <-served })
		return s
	}
	srv := agent()

	zt := startProc(t, nil, bin, "-zds", sock, "-dns", "0")
	zt.wait(t, "the workload added", func(r proxylog.Record) bool { return r.Event == "add" && r.Workload == uid })
	startProc(t, node, bin, "echo", "tcp", ":9000")
	startProc(t, pod, bin, "echo", "tcp", ":8080")

	dial := func(from *harness.NS, addr, msg string) error {
		out, err := from.Exec(bin, "dial", addr, msg)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if strings.TrimSpace(out) != msg {
			return fmt.Errorf("reply %q, want %q", out, msg)
		}
		return nil
	}
	check := func(from *harness.NS, listener, addr, srcHost string) {
		t.Helper()
		msg := listener + "-" + addr
		if err := dial(from, addr, msg); err != nil {
			t.Fatalf("%s to %s: %v", listener, addr, err)
		}
		rec := zt.wait(t, listener+" "+addr, func(r proxylog.Record) bool {
			return r.Event == "conn" && r.Listener == listener
		})
		host, _, _ := net.SplitHostPort(rec.Src)
		if rec.OrigDst != addr || rec.Workload != uid || host != srcHost {
			t.Errorf("%s to %s: stand-in logged %+v; want orig_dst %s, workload %s, src %s", listener, addr, rec, addr, uid, srcHost)
		}
	}
	traffic := func() {
		t.Helper()
		check(pod, "outbound", "198.18.0.1:9000", "198.18.0.2")
		check(pod, "outbound", "[fd42:6d77::1]:9000", "fd42:6d77::2")
		check(node, "inbound", "198.18.0.2:8080", "198.18.0.1")
		check(node, "inbound", "[fd42:6d77::2]:8080", "fd42:6d77::1")
	}
	traffic()
	if got := srv.Stats(); got != (zds.Stats{Connected: 1, Handoffs: 1}) {
		t.Errorf("agent stats %+v", got)
	}

	// The agent restarts: the stand-in reconnects, gets the snapshot and
	// keeps the pod (no second add), and capture goes on.
	srv.Close()
	srv = agent()
	deadline := time.Now().Add(10 * time.Second)
	for srv.Stats().Handoffs != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the stand-in did not reconnect: %+v", srv.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	traffic()

	mu.Lock()
	enrolled = nil
	mu.Unlock()
	if err := srv.Del(context.Background(), uid); err != nil {
		t.Fatal(err)
	}
	zt.wait(t, "the workload deleted", func(r proxylog.Record) bool { return r.Event == "del" && r.Workload == uid })
	if err := dial(pod, "198.18.0.1:9000", "after-del"); err == nil {
		t.Error("outbound TCP went through after DelWorkload")
	}
}
