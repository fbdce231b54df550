//go:build kernel

package e2e

import (
	"bufio"
	"bytes"
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
	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

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
// real proxy, REDIRECT and TPROXY, IPv4 and IPv6; the counters prove the
// fast path carried the bytes it may carry (sidecar -> app by default, both
// directions with --into-proxy).
func TestFastpathTraffic(t *testing.T) {
	for _, flags := range [][]string{nil, {"--into-proxy"}} {
		name := "default"
		if flags != nil {
			name = "into-proxy"
		}
		t.Run(name, func(t *testing.T) {
			for _, mode := range []string{"REDIRECT", "TPROXY"} {
				t.Run(mode, func(t *testing.T) {
					h := harness.New(t)
					fastpathAttach(t, h, flags...)
					e := ie.New(t, h)
					e.StartProxy(mode == "TPROXY")
					e.MustIptablesInit("-m", mode, "-i", "*", "-b", "*")
					for _, fam := range interceptFamilies {
						t.Run(fam.name, func(t *testing.T) {
							before := fastpathStatus(t, h)
							fastpathBothWays(t, e, fam.v6)
							after := fastpathStatus(t, h)
							pairs := after.Pairs - before.Pairs
							bytes := after.RedirectedBytes - before.RedirectedBytes
							kept := after.KeptForProxy - before.KeptForProxy
							// Every size went both ways twice, outbound and
							// inbound; the app's echo doubles nothing, the
							// replies carry a prefix.
							var sent uint64
							for _, n := range fastpathSizes {
								sent += 2 * uint64(n+1)
							}
							if pairs != 2 {
								t.Errorf("pairs grew by %d, want 2 (outbound and inbound)", pairs)
							}
							if flags == nil {
								// Replies toward the app: at least every
								// byte of them after the first message.
								if bytes < sent || kept == 0 {
									t.Errorf("default flags: %d bytes redirected (want >= %d, the replies to the app), %d messages kept for the proxy (want > 0)", bytes, sent, kept)
								}
							} else if bytes < 3*sent || kept != 0 {
								t.Errorf("--into-proxy: %d bytes redirected (want >= %d, most of both directions), %d kept for the proxy (want 0)", bytes, 3*sent, kept)
							}
							t.Logf("%+v", after.Counters)
						})
					}
				})
			}
		})
	}
}

// TestFastpathInterceptPlugin: the same with the rules installed by the
// intercept CNI plugin is covered by TestMeshwireDemo (the demo's mesh pod
// chains intercept and runs with the fast path attached).

// TestFastpathSpliceProxy: a proxy that copies with splice() (Go's io.Copy
// between two TCP connections) keeps working with default flags: nothing
// is ever queued where splice cannot see it.
func TestFastpathSpliceProxy(t *testing.T) {
	h := harness.New(t)
	fastpathAttach(t, h)
	e := ie.New(t, h)
	e.StartProxy(false, "-copy", "splice")
	e.MustIptablesInit("-m", "REDIRECT", "-i", "*", "-b", "*")
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
// other's bytes.
func TestFastpathIdenticalTuples(t *testing.T) {
	h := harness.New(t)
	fastpathAttach(t, h, "--into-proxy")
	var envs []*ie.Env
	for range 2 {
		e := ie.New(t, h)
		e.StartProxy(false)
		e.MustIptablesInit("-m", "REDIRECT", "-i", "*", "-b", "*")
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
}

// TestFastpathLifecycle: sockets from before attach keep working (on TCP);
// half-closes and mid-stream closes; detach with an accelerated connection
// open (it keeps working, the pins go, a holder keeps the sockhash until
// the connection closes); re-attach; a second attach is a no-op and one
// with other settings is refused.
func TestFastpathLifecycle(t *testing.T) {
	h := harness.New(t)
	e := ie.New(t, h)
	e.StartProxy(false)
	e.MustIptablesInit("-m", "REDIRECT", "-i", "*", "-b", "*")
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
	waitNoHolder(t)

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

// waitNoHolder waits for the detach holder to exit once its sockets closed.
func waitNoHolder(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := holderPids()
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the detach holder (pids %v) is still running after its last socket closed", pids)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// holderPids lists the processes running `meshwire fastpath hold`.
func holderPids() []string {
	var pids []string
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte("fastpath\x00hold\x00")) {
			pids = append(pids, filepath.Base(filepath.Dir(p)))
		}
	}
	return pids
}

// TestFastpathConcurrent: 50 connections at once, every reply byte-exact,
// and the sockhash empty once they are closed.
func TestFastpathConcurrent(t *testing.T) {
	h := harness.New(t)
	fastpathAttach(t, h, "--into-proxy")
	e := ie.New(t, h)
	e.StartProxy(false)
	e.MustIptablesInit("-m", "REDIRECT", "-i", "*", "-b", "*")
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
}
