//go:build kernel

package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// redirectedPod is the interception environment the fast-path tests use:
// a pod whose TCP goes through a uid-1337 proxy (proxyArgs are the test
// proxy's extra flags) by iptables-init's REDIRECT rules for every
// address and port.
func redirectedPod(t *testing.T, h *harness.H, proxyArgs ...string) *ie.Env {
	return interceptedPod(t, h, "REDIRECT", proxyArgs...)
}

// fastpathModes are the interception modes the fast path is tested
// under: REDIRECT's rules, and EBPF mode's connect() hooks, whose captured
// connections reach the sidecar over loopback.
var fastpathModes = []string{"REDIRECT", "EBPF"}

// interceptedPod is redirectedPod in interception mode REDIRECT, TPROXY
// (the proxy transparent) or EBPF. An EBPF pod's registration is removed
// when t ends (before its namespace goes), so that the programs can be
// detached without force.
func interceptedPod(t *testing.T, h *harness.H, mode string, proxyArgs ...string) *ie.Env {
	t.Helper()
	e := ie.New(t, h)
	e.StartProxy(mode == "TPROXY", proxyArgs...)
	e.MustIptablesInit("-m", mode, "-i", "*", "-b", "*")
	if mode == "EBPF" {
		t.Cleanup(func() {
			if code, out := e.IptablesInit("--cleanup-only"); code != 0 {
				t.Errorf("iptables-init --cleanup-only: exit %d: %s", code, out)
			}
		})
	}
	return e
}

// fastpathEachMode runs f as a subtest per fastpathModes; in EBPF mode
// it then checks that the pod's namespace has no conntrack entry and no
// netfilter rule (the fast path moves the bytes, the hooks the
// connections).
func fastpathEachMode(t *testing.T, f func(t *testing.T, mode string) *ie.Env) {
	for _, mode := range fastpathModes {
		t.Run(mode, func(t *testing.T) {
			e := f(t, mode)
			if mode == "EBPF" && !t.Failed() {
				assertNoNetfilter(t, e.Pod)
			}
		})
	}
}

// fastpathCmd runs the built `meshwire fastpath ARGS` and returns its exit
// code and output.
func fastpathCmd(t *testing.T, h *harness.H, args ...string) (int, string) {
	t.Helper()
	code, out, err := ie.Fastpath(h, args...)
	if err != nil {
		t.Fatalf("run meshwire fastpath: %v", err)
	}
	return code, out
}

// fastpathAttach attaches the fast path for the test and detaches it at
// cleanup (also when the test fails).
func fastpathAttach(t *testing.T, h *harness.H, args ...string) {
	t.Helper()
	if code, out := fastpathCmd(t, h, append([]string{"attach"}, args...)...); code != 0 {
		t.Fatalf("fastpath attach: exit %d: %s", code, out)
	}
	t.Cleanup(func() { fastpathDetach(t, h) })
}

func fastpathDetach(t *testing.T, h *harness.H) string {
	t.Helper()
	code, out := fastpathCmd(t, h, "detach")
	if code != 0 {
		t.Errorf("fastpath detach: exit %d: %s", code, out)
	}
	return out
}

func fastpathStatus(t *testing.T, h *harness.H) fastpath.Status {
	t.Helper()
	st, err := ie.FastpathStatus(h)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// pingPong sends rounds lines of payload on one connection to an echo server
// ("WHO PEER MSG" answers) and checks each answer byte for byte; a stall
// fails at the deadline.
func pingPong(t *testing.T, c net.Conn, rounds int, payload []byte, wantPrefix string) {
	t.Helper()
	if err := pingPongErr(c, rounds, payload, wantPrefix); err != nil {
		t.Fatal(err)
	}
}

func pingPongErr(c net.Conn, rounds int, payload []byte, wantPrefix string) error {
	r := bufio.NewReaderSize(c, 64<<10)
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	want := append([]byte(wantPrefix), payload...)
	msg := append(append([]byte(nil), payload...), '\n')
	for i := range rounds {
		if len(payload) == 1 {
			// Two one-byte messages: the smallest the fast path sees.
			if _, err := c.Write(msg[:1]); err != nil {
				return fmt.Errorf("round %d: write: %v", i, err)
			}
			if _, err := c.Write(msg[1:]); err != nil {
				return fmt.Errorf("round %d: write: %v", i, err)
			}
		} else if _, err := c.Write(msg); err != nil {
			return fmt.Errorf("round %d: write: %v", i, err)
		}
		line, err := r.ReadBytes('\n')
		if err != nil {
			return fmt.Errorf("round %d of %d-byte messages: read: %v", i, len(payload), err)
		}
		if !bytes.Equal(line[:len(line)-1], want) {
			return fmt.Errorf("round %d: reply of %d bytes differs from the %d expected (first 60: %q)", i, len(line)-1, len(want), line[:min(60, len(line))])
		}
	}
	return nil
}

func randomLine(n int) []byte {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return b
}

// fastpathSizes are the message sizes every traffic test sends both ways.
var fastpathSizes = []int{1, 64, 4096, 64 << 10, 4 << 20}

// fastpathBothWays runs every size outbound (app -> remote through the
// proxy) and inbound (remote -> app through the proxy) and checks that the
// proxy learned the outbound original destination.
func fastpathBothWays(t *testing.T, e *ie.Env, v6 bool) {
	t.Helper()
	pod, remote := ie.Pod(v6), ie.Remote(v6)
	mark := e.Proxy.Mark()
	out, err := ie.Dial(e.Pod, ie.AP(remote, ie.RemotePort))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	for _, n := range fastpathSizes {
		pingPong(t, out, 2, randomLine(n), "remote "+pod.String()+" ")
	}
	in, err := ie.Dial(e.Remote, ie.AP(pod, ie.AppPort))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	for _, n := range fastpathSizes {
		pingPong(t, in, 2, randomLine(n), "app "+interceptPassthrough(v6)+" ")
	}
	recs := e.Proxy.Since(mark)
	if len(recs) != 2 || recs[0].Listener != "outbound" || recs[0].OrigDst != ie.AP(remote, ie.RemotePort).String() || recs[0].Err != "" {
		t.Fatalf("the proxy's records %+v: want the outbound connection with original destination %s, then the inbound one", recs, ie.AP(remote, ie.RemotePort))
	}
}

// TestFastpathTraffic: byte-exact data of every size both ways through the
// real proxy, REDIRECT, TPROXY and EBPF mode, IPv4 and IPv6; the counters prove the
// fast path carried the bytes it may carry (sidecar -> app by default, both
// directions with --into-proxy).
func TestFastpathTraffic(t *testing.T) {
	for _, flags := range [][]string{nil, {"--into-proxy"}} {
		name := "default"
		if flags != nil {
			name = "into-proxy"
		}
		t.Run(name, func(t *testing.T) {
			for _, mode := range []string{"REDIRECT", "TPROXY", "EBPF"} {
				t.Run(mode, func(t *testing.T) {
					h := harness.New(t)
					fastpathAttach(t, h, flags...)
					e := interceptedPod(t, h, mode)
					for _, fam := range interceptFamilies {
						t.Run(fam.name, func(t *testing.T) {
							fastpathCarried(t, h, e, fam.v6, flags != nil)
						})
					}
					if mode == "EBPF" {
						assertNoNetfilter(t, e.Pod)
					}
				})
			}
		})
	}
}

// fastpathCarried runs fastpathBothWays and checks, from the counters,
// what the fast path carried: with fed, the proxy was fed too (most bytes
// of both directions, none kept back); without, only the application was
// (the replies toward it, and messages kept back from the proxy).
func fastpathCarried(t *testing.T, h *harness.H, e *ie.Env, v6, fed bool) {
	t.Helper()
	before := fastpathStatus(t, h)
	fastpathBothWays(t, e, v6)
	after := fastpathStatus(t, h)
	d := after.Counters.Sub(before.Counters)
	// Every size went both ways twice, outbound and inbound; the app's
	// echo doubles nothing, the replies carry a prefix.
	var sent uint64
	for _, n := range fastpathSizes {
		sent += 2 * uint64(n+1)
	}
	if d.Pairs != 2 {
		t.Errorf("pairs grew by %d, want 2 (outbound and inbound)", d.Pairs)
	}
	if !fed {
		// Replies toward the app: at least every byte of them after the
		// first message.
		if d.RedirectedBytes < sent || d.KeptForProxy == 0 {
			t.Errorf("proxy not fed: %d bytes redirected (want >= %d, the replies to the app), %d messages kept for the proxy (want > 0)", d.RedirectedBytes, sent, d.KeptForProxy)
		}
	} else if d.RedirectedBytes < 3*sent || d.KeptForProxy != 0 {
		t.Errorf("proxy fed: %d bytes redirected (want >= %d, most of both directions), %d kept for the proxy (want 0)", d.RedirectedBytes, 3*sent, d.KeptForProxy)
	}
	t.Logf("%+v", d)
}

// TestFastpathPodPolicy: attached as the DaemonSet ships it (default
// flags), the chained intercept plugin writes each meshed pod's policy at
// ADD, keyed by its namespace: an Istio pod's proxy (Envoy) is fed, so both
// directions are carried; the annotation fastpath.meshwire.io/into-proxy
// turns that off for a pod, or on for a pod of another mesh; DEL removes
// the policy.
func TestFastpathPodPolicy(t *testing.T) {
	h := harness.New(t)
	fastpathAttach(t, h)
	e := ie.New(t, h)
	e.StartProxy(false)
	list := loopbackIntercept(t, h, "mwtfp-mesh")
	for _, c := range []struct {
		name        string
		annotations map[string]string
		fed         bool
	}{
		{"istio", map[string]string{"sidecar.istio.io/status": istioStatus}, true},
		{"istio-opted-out", map[string]string{"sidecar.istio.io/status": istioStatus, "fastpath.meshwire.io/into-proxy": "false"}, false},
		{"other-mesh", map[string]string{"intercept.meshwire.io/enabled": "true"}, false},
		{"other-mesh-opted-in", map[string]string{"intercept.meshwire.io/enabled": "true", "fastpath.meshwire.io/into-proxy": "true"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := h.Attach(list, e.Pod, "lo", map[string]any{"io.kubernetes.cri.pod-annotations": c.annotations})
			a.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "p1"}, {"K8S_POD_INFRA_CONTAINER_ID", a.RT.ContainerID}}
			a.MustAdd()
			p, ok := podPolicy(t, e.Pod)
			if !ok || p.IntoProxy != c.fed {
				t.Fatalf("policy after ADD: %+v (present %v), want into-proxy %v", p, ok, c.fed)
			}
			if n := fastpathStatus(t, h).PodPolicies; n != 1 {
				t.Errorf("status counts %d pod policies, want 1", n)
			}
			fastpathCarried(t, h, e, false, c.fed)
			if err := a.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if _, ok := podPolicy(t, e.Pod); ok {
				t.Fatal("DEL left the pod's policy")
			}
			if n := fastpathStatus(t, h).PodPolicies; n != 0 {
				t.Errorf("status counts %d pod policies after DEL, want 0", n)
			}
			if out, err := e.Pod.Exec("ip", "link", "set", "lo", "up"); err != nil {
				t.Fatalf("lo up: %v %s", err, out)
			}
		})
	}
}

// podPolicy reads the fast-path policy of the pod in ns.
func podPolicy(t *testing.T, ns *harness.NS) (p podpolicy.Policy, ok bool) {
	t.Helper()
	err := netns.Enter(ns.Path, func() error {
		var err error
		p, ok, err = podpolicy.Get("")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, ok
}

// TestFastpathSpliceProxy: a proxy that copies with splice() (Go's io.Copy
// between two TCP connections) keeps working with default flags: nothing
// is ever queued where splice cannot see it. In REDIRECT and EBPF mode.
func TestFastpathSpliceProxy(t *testing.T) {
	fastpathEachMode(t, func(t *testing.T, mode string) *ie.Env {
		h := harness.New(t)
		fastpathAttach(t, h)
		e := interceptedPod(t, h, mode, "-copy", "splice")
		for _, fam := range interceptFamilies {
			t.Run(fam.name, func(t *testing.T) {
				before := fastpathStatus(t, h)
				fastpathBothWays(t, e, fam.v6)
				after := fastpathStatus(t, h)
				if after.RedirectedMessages == before.RedirectedMessages {
					t.Fatalf("nothing was redirected (%+v): the test would not see a stall", after.Counters)
				}
			})
		}
		return e
	})
}

// TestFastpathSpliceNegativeControl: the hazard the default protects
// against is real, and the kernel probe tells it. With --into-proxy a
// splice-copying proxy is fed by the fast path: on a kernel whose splice()
// does not read redirected bytes (fastpath.SplicesRedirected false, every
// released kernel) its connection stalls; on one that does, it works.
func TestFastpathSpliceNegativeControl(t *testing.T) {
	h := harness.New(t)
	fastpathAttach(t, h, "--into-proxy")
	e := redirectedPod(t, h, "-copy", "splice")
	splices, err := fastpath.SplicesRedirected()
	if err != nil {
		t.Fatal(err)
	}
	if st := fastpathStatus(t, h); st.KernelSplices != splices {
		t.Fatalf("status says kernel_splices %v, the probe %v", st.KernelSplices, splices)
	}
	c, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, ie.RemotePort))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := fastpathStatus(t, h)
	// The first message may race the pairing and go on TCP, which the
	// proxy splices; the next ones go on the fast path.
	r := bufio.NewReader(c)
	stalled := false
	for i := 0; i < 5 && !stalled; i++ {
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := fmt.Fprintf(c, "splice-%d\n", i); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			stalled = true
		case err != nil:
			t.Fatalf("round %d: %v", i, err)
		case !strings.HasSuffix(line, fmt.Sprintf("splice-%d\n", i)):
			t.Fatalf("round %d: reply %q", i, line)
		}
	}
	fed := fastpathStatus(t, h).Counters.Sub(before.Counters)
	if fed.RedirectedMessages == 0 {
		t.Fatalf("the fast path carried nothing (%+v): the control tests nothing", fed)
	}
	if stalled == splices {
		t.Fatalf("a splice-copying proxy fed by the fast path stalled: %v; the kernel probe says splice reads redirected bytes: %v", stalled, splices)
	}
}

// dialFrom opens a connection from inside ns from a fixed local address.
func dialFrom(ns *harness.NS, src, dst netip.AddrPort) (*net.TCPConn, error) {
	c, err := probe.InNS(ns.Path, func() (net.Conn, error) {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(src)}
		return d.Dial("tcp", dst.String())
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// TestFastpathIdenticalTuples: two pods with the same addresses, whose apps
// connect from the same port to the same destination, never get each
// other's bytes. In REDIRECT and EBPF mode (where the original destination
// is filed per namespace and client endpoint).
func TestFastpathIdenticalTuples(t *testing.T) {
	fastpathEachMode(t, fastpathIdenticalTuples)
}

func fastpathIdenticalTuples(t *testing.T, mode string) *ie.Env {
	h := harness.New(t)
	fastpathAttach(t, h, "--into-proxy")
	var envs []*ie.Env
	for range 2 {
		e := interceptedPod(t, h, mode)
		envs = append(envs, e)
	}
	before := fastpathStatus(t, h)
	src := ie.AP(ie.PodV4, 41000)
	var conns []*net.TCPConn
	for _, e := range envs {
		c, err := dialFrom(e.Pod, src, ie.AP(ie.RemoteV4, ie.RemotePort))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			payload := append([]byte(fmt.Sprintf("pod%d-", i)), randomLine(4000)...)
			errs[i] = pingPongErr(c, 200, payload, "remote "+ie.PodV4.String()+" ")
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
	}
	after := fastpathStatus(t, h)
	if after.Pairs-before.Pairs != 2 || after.RedirectedMessages-before.RedirectedMessages < 2*200 {
		t.Fatalf("want both connections paired and on the fast path: before %+v, after %+v", before.Counters, after.Counters)
	}
	return envs[0]
}

// TestFastpathLifecycle: sockets from before attach keep working (on TCP);
// half-closes and mid-stream closes; detach with an accelerated connection
// open (it keeps working, the pins go, the kernel frees the sockhash once
// the connection closes); re-attach; a second attach is a no-op and one
// with other settings is refused.
func TestFastpathLifecycle(t *testing.T) {
	h := harness.New(t)
	e := redirectedPod(t, h)
	remote := ie.AP(ie.RemoteV4, ie.RemotePort)
	prefix := "remote " + ie.PodV4.String() + " "

	if st := fastpathStatus(t, h); st.Attached {
		t.Fatalf("attached before the test: %+v", st)
	}
	if code, out := fastpathCmd(t, h, "detach"); code != 0 || !strings.Contains(out, "not attached") {
		t.Fatalf("detach when not attached: exit %d: %s", code, out)
	}
	early, err := ie.Dial(e.Pod, remote)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	pingPong(t, early, 3, randomLine(100), prefix)

	fastpathAttach(t, h, "--into-proxy")
	if code, out := fastpathCmd(t, h, "attach", "--into-proxy"); code != 0 || !strings.Contains(out, "already attached") {
		t.Fatalf("second attach: exit %d: %s", code, out)
	}
	if code, out := fastpathCmd(t, h, "attach", "--proxy-uid", "1000"); code != 1 || !strings.Contains(out, "detach first") {
		t.Fatalf("attach with another uid: exit %d: %s", code, out)
	}
	// The connection from before attach works, on TCP.
	st0 := fastpathStatus(t, h)
	pingPong(t, early, 3, randomLine(100), prefix)
	if st := fastpathStatus(t, h); st.RedirectedMessages != st0.RedirectedMessages || st.LiveSockets != 0 {
		t.Fatalf("a connection from before attach was taken: %+v", st)
	}

	// Half-close: the sink answers with the byte count after our FIN, which
	// must come after every byte the fast path carried.
	sink, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, ie.SinkPort))
	if err != nil {
		t.Fatal(err)
	}
	data := randomLine(3 << 20)
	for off := 0; off < len(data); off += 100 << 10 {
		if _, err := sink.Write(data[off:min(off+100<<10, len(data))]); err != nil {
			t.Fatal(err)
		}
	}
	_ = sink.CloseWrite()
	_ = sink.SetDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(sink)
	sink.Close()
	if err != nil || strings.TrimSpace(string(got)) != strconv.Itoa(len(data)) {
		t.Fatalf("half-closed upload: sink counted %q (%v), want %d", got, err, len(data))
	}

	// Mid-stream close: the app closes while a reply is on its way.
	for range 5 {
		c, err := ie.Dial(e.Pod, remote)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write(append(randomLine(2<<20), '\n'))
		c.Close()
	}

	live, err := ie.Dial(e.Pod, remote)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	st1 := fastpathStatus(t, h)
	pingPong(t, live, 10, randomLine(1000), prefix)
	if st := fastpathStatus(t, h); st.RedirectedMessages <= st1.RedirectedMessages {
		t.Fatalf("a new connection was not accelerated: %+v", st)
	}

	out := fastpathDetach(t, h)
	if !strings.Contains(out, "keep it until they close") {
		t.Fatalf("detach with a live accelerated connection: %s", out)
	}
	if _, err := os.Stat(fastpath.DefaultPinDir); !os.IsNotExist(err) {
		t.Fatalf("pins left after detach: %v", err)
	}
	if st := fastpathStatus(t, h); st.Attached {
		t.Fatalf("still attached after detach: %+v", st)
	}
	pingPong(t, live, 10, randomLine(70000), prefix)
	live.Close()
	waitSockhashFreed(t)

	// Re-attach: new connections are accelerated again.
	fastpathAttach(t, h)
	again, err := ie.Dial(e.Pod, remote)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	pingPong(t, again, 5, randomLine(100), prefix)
	if st := fastpathStatus(t, h); st.RedirectedMessages == 0 {
		t.Fatalf("re-attached fast path carried nothing: %+v", st)
	}
	pingPong(t, early, 3, randomLine(100), prefix)
}

// TestFastpathConcurrent: 50 connections at once, every reply byte-exact,
// and the sockhash empty once they are closed. In REDIRECT and EBPF mode.
func TestFastpathConcurrent(t *testing.T) {
	fastpathEachMode(t, fastpathConcurrent)
}

func fastpathConcurrent(t *testing.T, mode string) *ie.Env {
	h := harness.New(t)
	fastpathAttach(t, h, "--into-proxy")
	e := interceptedPod(t, h, mode)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, ie.RemotePort))
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			payload := append([]byte(fmt.Sprintf("c%d-", i)), randomLine(64+i*1000)...)
			if err := pingPongErr(c, 30, payload, "remote "+ie.PodV4.String()+" "); err != nil {
				errs <- fmt.Errorf("connection %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := fastpathStatus(t, h)
	if st.Pairs < 50 || st.RedirectedMessages < 50*30 {
		t.Fatalf("want 50 pairs and most messages redirected: %+v", st.Counters)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st.LiveSockets != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sockets left in the sockhash after every connection closed", st.LiveSockets)
		}
		time.Sleep(100 * time.Millisecond)
		st = fastpathStatus(t, h)
	}
	return e
}

// TestFastpathRefused: bad flags exit 2; a setup that cannot work (pins
// outside bpffs) exits 1 naming the problem and changes nothing.
func TestFastpathRefused(t *testing.T) {
	h := harness.New(t)
	for _, args := range [][]string{
		{"attach", "--proxy-uid", "x"},
		{"attach", "--proxy-uid", "-1"},
		{"attach", "--outbound-port", "0"},
		{"attach", "--outbound-port", "70000"},
		{"attach", "extra"},
		{"status", "--bogus"},
		{"explode"},
		{},
	} {
		if code, out := fastpathCmd(t, h, args...); code != 2 || out == "" {
			t.Errorf("fastpath %q: exit %d, want 2 with a message: %s", args, code, out)
		}
	}
	dir := t.TempDir()
	pins := filepath.Join(dir, "pins")
	code, out := fastpathCmd(t, h, "attach", "--pin-dir", pins)
	if code != 1 || !strings.Contains(out, "pin") || !strings.Contains(out, "nothing was changed") {
		t.Fatalf("attach with pins outside bpffs: exit %d: %s", code, out)
	}
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Fatalf("the failed attach left %s behind", pins)
	}
	if st := fastpathStatus(t, h); st.Attached {
		t.Fatalf("a failed attach left the fast path attached: %+v", st)
	}
	// Another layout's fast path (pinned beside this one's, as an older
	// meshwire pins it) would keep taking the sockets: attach refuses and
	// says how to detach it.
	older := filepath.Join(loader.FastpathRoot, "v1")
	if code, out := fastpathCmd(t, h, "attach", "--pin-dir", older); code != 0 {
		t.Fatalf("attach at %s: exit %d: %s", older, code, out)
	}
	t.Cleanup(func() { fastpathCmd(t, h, "detach", "--pin-dir", older) })
	code, out = fastpathCmd(t, h, "attach")
	if code != 1 || !strings.Contains(out, older) || !strings.Contains(out, "detach") {
		t.Fatalf("attach beside another layout: exit %d: %s", code, out)
	}
	if _, err := os.Stat(fastpath.DefaultPinDir); !os.IsNotExist(err) {
		t.Fatalf("the refused attach pinned in %s", fastpath.DefaultPinDir)
	}
}

// TestFastpathSwitchAfter4GiB: a direction that started on TCP switches to
// the fast path only once its receiver has read every byte, also when the
// receiver stayed silent for exactly 2^32 bytes, where the sequence
// numbers match again. The app sends 4 GiB toward the proxy while the pod's
// proxy is not fed (on TCP), the remote behind the proxy stops reading 1
// MiB before the end (so the proxy has unread bytes from the app) and
// never answers (so the proxy never sends to the app, and never publishes
// how far it has read), the pod's policy then allows feeding the proxy,
// and the app sends a marker. Compared on 32 bits, the marker would be
// handed to the proxy ahead of the unread MiB.
func TestFastpathSwitchAfter4GiB(t *testing.T) {
	h := harness.New(t)
	fastpathAttach(t, h)
	e := redirectedPod(t, h)
	const (
		total  = 1 << 32
		margin = 1 << 20
		port   = 9099
	)
	marker := []byte("MARKER!!")
	ln, err := probe.InNS(e.Remote.Path, func() (net.Listener, error) { return net.Listen("tcp", ":"+strconv.Itoa(port)) })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	resume := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
		buf, zeros := make([]byte, 1<<20), make([]byte, 1<<20)
		var n int64
		paused := false
		for n < total {
			if !paused && n >= total-margin {
				<-resume
				paused = true
			}
			want := min(int64(len(buf)), total-n)
			if !paused {
				want = min(want, total-margin-n)
			}
			k, err := c.Read(buf[:want])
			if !bytes.Equal(buf[:k], zeros[:k]) {
				got <- fmt.Errorf("at byte %d of %d: %q where zeros were sent: the marker overtook bytes sent before it", n, int64(total), buf[:min(k, 16)])
				return
			}
			n += int64(k)
			if err != nil {
				got <- fmt.Errorf("after %d bytes: %v", n, err)
				return
			}
		}
		if _, err := io.ReadFull(c, buf[:len(marker)]); err != nil || !bytes.Equal(buf[:len(marker)], marker) {
			got <- fmt.Errorf("after the 4 GiB: %q, %v; want the marker", buf[:len(marker)], err)
			return
		}
		got <- nil
	}()
	before := fastpathStatus(t, h)
	app, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, port))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	chunk := make([]byte, 4<<20)
	_ = app.SetWriteDeadline(time.Now().Add(2 * time.Minute))
	for sent := 0; sent < total; sent += len(chunk) {
		if _, err := app.Write(chunk); err != nil {
			t.Fatalf("app write after %d bytes: %v", sent, err)
		}
	}
	mid := fastpathStatus(t, h)
	if d := mid.Counters.Sub(before.Counters); d.Pairs != 1 || d.KeptForProxy == 0 || d.RedirectedMessages != 0 {
		t.Fatalf("the 4 GiB should have gone on TCP, kept from the proxy: %+v", d)
	}
	if err := netns.Enter(e.Pod.Path, func() error {
		_, err := podpolicy.Set("", podpolicy.Policy{IntoProxy: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := app.Write(marker); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the marker reaches the proxy, by TCP or not
	close(resume)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	// Nothing switched: the proxy has still not published its reading.
	if d := fastpathStatus(t, h).Counters.Sub(mid.Counters); d.RedirectedMessages != 0 {
		t.Errorf("the marker went on the fast path (%+v)", d)
	}
}

// TestFastpathForeignListener: a process of another uid than the proxy's
// listening on the outbound capture port makes no namespace a sidecar's,
// whether it was there at attach (the seeding) or came after (the listen
// callback): the namespace's connections are not tracked.
func TestFastpathForeignListener(t *testing.T) {
	h := harness.New(t)
	e := ie.New(t, h)
	untracked := func(when string) {
		t.Helper()
		before := fastpathStatus(t, h)
		c, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, ie.RemotePort))
		if err != nil {
			t.Fatal(err)
		}
		pingPong(t, c, 2, randomLine(64), "remote "+ie.PodV4.String()+" ")
		c.Close()
		if d := fastpathStatus(t, h).Counters.Sub(before.Counters); d.Sockets != 0 {
			t.Errorf("%s: a root process listening on %d made the pod's connection tracked: %+v", when, ie.ProxyOutPort, d)
		}
	}
	e.StartProxyAs(0, 0, false)
	fastpathAttach(t, h)
	untracked("listening at attach")
	e.StopProxy()
	e.StartProxyAs(0, 0, false)
	untracked("listening after attach")
}

// TestFastpathProxyGID: a proxy matched by its gid only (iptables-init's
// --proxy-gid; it runs as another uid, listening before attach) is the
// sidecar with attach's --proxy-gid: attach finds its namespace from the
// listener's process, its accepted and passthrough sockets are the proxy's,
// and both directions of an outbound and an inbound connection are
// carried. Without --proxy-gid its pod is not a sidecar's: nothing is.
func TestFastpathProxyGID(t *testing.T) {
	h := harness.New(t)
	e := ie.New(t, h)
	e.StartProxyAs(4242, ie.ProxyUID, false)
	e.MustIptablesInit("-m", "REDIRECT", "-u", "4343", "-g", strconv.Itoa(ie.ProxyUID), "-i", "*", "-b", "*")
	t.Run("by gid", func(t *testing.T) {
		fastpathAttach(t, h, "--into-proxy", "--proxy-gid", strconv.Itoa(ie.ProxyUID))
		if st := fastpathStatus(t, h); st.ProxyGID == nil || *st.ProxyGID != ie.ProxyUID {
			t.Fatalf("status: %+v", st)
		}
		for _, fam := range interceptFamilies {
			t.Run(fam.name, func(t *testing.T) { fastpathCarried(t, h, e, fam.v6, true) })
		}
	})
	t.Run("uid only", func(t *testing.T) {
		fastpathAttach(t, h, "--into-proxy")
		before := fastpathStatus(t, h)
		fastpathBothWays(t, e, false)
		if d := fastpathStatus(t, h).Counters.Sub(before.Counters); d.Pairs != 0 || d.RedirectedMessages != 0 {
			t.Fatalf("a proxy of another uid was taken for the sidecar without --proxy-gid: %+v", d)
		}
	})
}
