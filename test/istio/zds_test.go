//go:build kernel

package istio

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/zds"
	"github.com/meshwire/meshwire/test/harness"
	"github.com/meshwire/meshwire/test/interceptenv"
)

// TestZtunnelStandIn: a pod with Istio's ambient in-pod rules (meshwire's,
// applied through its firewall) and istio-cni's in-pod policy route; the
// node agent's ZDS server hands the pod's netns to the test proxy running
// as ztunnel (-zds). Outbound TCP from the pod reaches a server on the
// node through the stand-in's 15001 with its original destination, and
// inbound TCP from the node reaches the pod's app through 15006, on IPv4
// and IPv6, the app seeing the client's address. The stand-in reconnects
// to a restarted agent and keeps the pod, and DelWorkload takes its
// listeners away (the pod's outbound TCP then has nowhere to go). The
// remote namespace of interceptenv stands for the node and the world, so
// that the host is left untouched.
func TestZtunnelStandIn(t *testing.T) {
	h := harness.New(t)
	e := interceptenv.New(t, h)
	// istio-cni's in-pod routing (not built in meshwire yet): packets
	// whose connection ztunnel made (connmark 0x111, restored as mark)
	// are delivered locally, to ztunnel's transparent socket.
	for _, fam := range []string{"-4", "-6"} {
		for _, args := range [][]string{
			{"ip", fam, "rule", "add", "fwmark", "0x111/0xfff", "pref", "32764", "lookup", "100"},
			{"ip", fam, "route", "add", "local", "default", "dev", "lo", "table", "100"},
		} {
			if out, err := e.Pod.Exec(args[0], args[1:]...); err != nil {
				t.Fatalf("%q: %v\n%s", args, err, out)
			}
		}
	}
	cfg := ambient.Config{IPv6: true, ProbeSNAT: ambient.DefaultProbeSNAT, ProbeSNATv6: ambient.DefaultProbeSNATv6}
	err := e.Pod.Do(func() error {
		fw := firewall.New(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT})
		defer fw.Close()
		return fw.Apply(context.Background(), ambient.InPodIPTables(cfg, ambient.Overrides{}))
	})
	if err != nil {
		t.Fatalf("in-pod rules: %v", err)
	}

	const uid = "0d6c5f5e-zds-test"
	wl := zds.Workload{UID: uid, Name: "app", Namespace: "default", ServiceAccount: "default",
		Netns: func() (*os.File, error) { return os.Open(e.Pod.Path) }}
	var mu sync.Mutex
	enrolled := []zds.Workload{wl}
	snapshot := func() []zds.Workload {
		mu.Lock()
		defer mu.Unlock()
		return append([]zds.Workload(nil), enrolled...)
	}
	sock := filepath.Join(t.TempDir(), "ztunnel.sock")
	agent := func() *zds.Server {
		s, err := zds.Listen(sock, snapshot)
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- s.Serve(context.Background()) }()
		t.Cleanup(func() { s.Close(); <-served })
		return s
	}
	srv := agent()

	// interceptenv's pod has an app on 15008: no HBONE listener.
	zt := e.StartZtunnel(sock, "-dns", "0", "-hbone", "0")
	// await looks at the records after mark: the agent's restart below
	// may end the stand-in's first connection with an error (a reset,
	// when the agent closes with the stand-in's reply unread), and that
	// one is expected.
	mark := 0
	await := func(what string, match func(interceptenv.Record) bool) interceptenv.Record {
		t.Helper()
		r, ok := zt.AwaitSince(mark, func(r interceptenv.Record) bool { return r.Event == "error" || match(r) }, 5*time.Second)
		if !ok || r.Event == "error" {
			t.Fatalf("waiting for %s: %+v", what, r)
		}
		return r
	}
	await("the workload added", func(r interceptenv.Record) bool { return r.Event == "add" && r.Workload == uid })
	await("the snapshot's end", func(r interceptenv.Record) bool { return r.Event == "snapshot" })

	// check makes one request from ns to dst, which must be answered by
	// who seeing the connection come from peer, and be logged by the
	// stand-in's listener with its original destination.
	check := func(ns *harness.NS, listener string, dst netip.AddrPort, who string, peer netip.Addr) {
		t.Helper()
		mark := zt.Mark()
		msg := listener + "-" + dst.String()
		got, err := interceptenv.Request(ns, dst, msg)
		if want := fmt.Sprintf("%s %s %s", who, peer, msg); err != nil || got != want {
			t.Fatalf("%s to %s: %q, %v; want %q", listener, dst, got, err, want)
		}
		var recs []interceptenv.Record
		for _, r := range zt.Since(mark) {
			if r.Event == "conn" {
				recs = append(recs, r)
			}
		}
		if len(recs) != 1 || recs[0].Listener != listener || recs[0].OrigDst != dst.String() || recs[0].Workload != uid {
			t.Errorf("%s to %s: the stand-in logged %+v; want one %s connection to %s of workload %s", listener, dst, recs, listener, dst, uid)
		}
	}
	traffic := func() {
		t.Helper()
		for _, v6 := range []bool{false, true} {
			check(e.Pod, "outbound", interceptenv.AP(interceptenv.Remote(v6), interceptenv.RemotePort), "remote", interceptenv.Pod(v6))
			// The app sees the client's address: the stand-in spoofs it.
			check(e.Remote, "inbound", interceptenv.AP(interceptenv.Pod(v6), interceptenv.AppPort), "app", interceptenv.Remote(v6))
		}
	}
	traffic()
	if got := srv.Stats(); got != (zds.Stats{Connected: 1, Handoffs: 1}) {
		t.Errorf("agent stats %+v", got)
	}

	// The agent restarts: the stand-in reconnects, gets the snapshot and
	// keeps the pod (no second add), and capture goes on.
	srv.Close()
	mark = zt.Mark()
	srv = agent()
	deadline := time.Now().Add(10 * time.Second)
	for snapshots := 0; snapshots == 0; {
		for _, r := range zt.Since(mark) {
			if r.Event == "snapshot" {
				snapshots++
			}
		}
		if snapshots == 0 && time.Now().After(deadline) {
			t.Fatal("the stand-in logged no snapshot's end from the restarted agent")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for srv.Stats().Handoffs != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the stand-in did not reconnect: %+v", srv.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	traffic()
	// traffic's last check synced the stand-in's log (Since), so the
	// mark is past the restart's records.
	mark = zt.Mark()

	mu.Lock()
	enrolled = nil
	mu.Unlock()
	if err := srv.Del(context.Background(), uid); err != nil {
		t.Fatal(err)
	}
	await("the workload deleted", func(r interceptenv.Record) bool { return r.Event == "del" && r.Workload == uid })
	dst := interceptenv.AP(interceptenv.RemoteV4, interceptenv.RemotePort)
	if got, err := interceptenv.Request(e.Pod, dst, "after-del"); err == nil {
		t.Errorf("outbound TCP went through after DelWorkload: %q", got)
	}
}
