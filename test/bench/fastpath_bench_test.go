//go:build kernel

package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
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
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// BenchmarkFastpath measures what the eBPF sockmap fast path (`meshwire
// fastpath attach`) gives an intercepted pod, side by side in one run with
// no interception (the limit) and with the interception rules alone:
//
//	no interception
//	REDIRECT, TPROXY                         (iptables-init -m MODE -i '*' -b '*')
//	REDIRECT + fast path, TPROXY + fast path (default flags, a pod with no
//	                                          policy: sidecar -> app only)
//	REDIRECT + fast path, Istio pod, TPROXY + fast path, Istio pod
//	        (as the DaemonSet ships it: default flags, and the pod's policy
//	        as the chained intercept plugin writes it for an Istio pod:
//	        its proxy is fed, both directions)
//
// on two paths, IPv4:
//
//   - the hop: the app <-> sidecar hop alone. The app in the pod connects to
//     the remote's echo port; the outbound rule captures the connection and
//     the test proxy, started with -answer, echoes it itself. With no
//     interception the app talks to the same test proxy program (started
//     with -answer, no rules in the pod) on 127.0.0.1:15006, its transparent
//     inbound listener: with no redirection recorded in conntrack it takes
//     the listener's own address for the destination, as for TPROXY, and
//     echoes. So every hop row is the same two processes and the same echo
//     code over loopback; "no interception" lacks only netfilter and the
//     fast path. (The pod's app echo server on 127.0.0.1:8000 would do too,
//     but it runs in the benchmark's own process, which saves the
//     cross-process wake-ups that dominate a loopback round trip here, and
//     it is other code: bufio, a formatted reply with a prefix.)
//   - the whole path: app -> sidecar -> remote echo server and back (the
//     proxy forwards), and with no interception app -> remote directly.
//     The remote's echo is a process of its own (startRemoteEcho), as a
//     server in another pod is.
//
// With no interception the hop is also timed over a Unix socket between
// the same two processes (unixref_bench_test.go), stated beside the hop's
// target: what the two processes' wake-ups cost with no TCP/IP at all. And
// in every configuration the hop's 64 B round trips are split at the app's
// system calls (syscalls_bench_test.go): what is inside write(2) and read(2)
// is what a faster hand-off can shrink, the rest is not.
//
// Measures: 64 B and 4 KiB request/response round trips on one persistent
// connection (median and p95 after a warm-up), 64 B round trips on 50
// concurrent connections (median over every round trip of every
// connection), and bulk throughput app -> sidecar -> remote sink (the sink
// server counts the bytes) with 64 KiB writes.
//
// Each configuration runs fastpathBenchReps times with its samples pooled,
// in a fresh pod and remote (interceptenv), the order of the configurations
// reversed every other repetition, each run starting on a settled machine
// (harness.WaitIdle). A configuration with the fast path attaches it before
// its proxy starts (the fast path learns the sidecar's namespace when the
// proxy listens) and detaches it when it ends, also when it fails; it fails
// unless `meshwire fastpath status --json` shows redirected_messages grew
// on each path.
//
// Targets (PASS/FAIL printed), for the Istio-pod rows (as deployed): hop 64
// B round trip <= 0.55x of REDIRECT alone; bulk throughput >= 1.5x of
// REDIRECT alone; on the whole path each round-trip median at least 25% of
// the way from REDIRECT alone to no interception. The rows of a pod with no
// policy have no target: they are today's safe default, reported as they
// are.
//
// Plot: with MESHWIRE_BENCH_PLOT=1 the round-trip medians per configuration
// are also drawn to docs/fastpath-bench.svg (hand-written SVG); without it
// the benchmark writes nothing into the tree:
//
//	MESHWIRE_BENCH_PLOT=1 make bench BENCH=BenchmarkFastpath
func BenchmarkFastpath(b *testing.B) {
	h := harness.New(b)
	if st := fastpathBenchStatus(b, h); st.Attached {
		b.Fatalf("the fast path is already attached on this node (pins in %s): this benchmark attaches and detaches it itself and leaves alone one it did not attach", st.PinDir)
	}
	res := map[string][]*fastpathBenchResult{}
	for _, path := range fastpathBenchPaths {
		res[path] = make([]*fastpathBenchResult, len(fastpathBenchConfigs))
		for i := range fastpathBenchConfigs {
			res[path][i] = &fastpathBenchResult{}
		}
	}
	start := time.Now()
	reps := fastpathBenchReps * b.N
	for rep := 0; rep < reps; rep++ {
		for k := range fastpathBenchConfigs {
			i := k
			if rep%2 == 1 {
				i = len(fastpathBenchConfigs) - 1 - k
			}
			fastpathBenchRun(b, h, fastpathBenchConfigs[i], res["hop"][i], res["whole"][i])
		}
	}
	b.Logf("BenchmarkFastpath: %d repetitions of %d configurations in %s", reps, len(fastpathBenchConfigs), time.Since(start).Round(time.Second))
	fastpathBenchReport(b, res, reps)
}

const (
	fastpathBenchReps     = 4         // runs per configuration (pooled), alternating the order
	fastpathBenchWarmup   = 200       // round trips before the timed ones
	fastpathBenchRounds   = 2000      // timed round trips on one connection, per run
	fastpathBenchConns    = 50        // concurrent connections
	fastpathBenchConnWarm = 20        // round trips per connection before the timed ones
	fastpathBenchConnRTs  = 200       // timed round trips per connection, per run
	fastpathBenchBytes    = 256 << 20 // bulk bytes per run
	fastpathBenchWrite    = 64 << 10  // bulk write size
)

// fastpathBenchPaths: "hop" is app <-> sidecar alone, "whole" is app ->
// sidecar -> remote.
var fastpathBenchPaths = []string{"hop", "whole"}

type fastpathBenchConfig struct {
	name string
	mode string // "" (no interception), "REDIRECT" or "TPROXY"
	fast bool   // fast path attached (default flags)
	pod  bool   // the pod's policy feeds its proxy (an Istio pod)
}

// The indexes below (none, REDIRECT) are what the ratios are against.
var fastpathBenchConfigs = []fastpathBenchConfig{
	{name: "no interception"},
	{name: "REDIRECT", mode: "REDIRECT"},
	{name: "TPROXY", mode: "TPROXY"},
	{name: "REDIRECT + fast path", mode: "REDIRECT", fast: true},
	{name: "TPROXY + fast path", mode: "TPROXY", fast: true},
	{name: "REDIRECT + fast path, Istio pod", mode: "REDIRECT", fast: true, pod: true},
	{name: "TPROXY + fast path, Istio pod", mode: "TPROXY", fast: true, pod: true},
}

const (
	fastpathBenchNone     = 0
	fastpathBenchRedirect = 1
)

// fastpathBenchResult is one configuration on one path, pooled over runs.
type fastpathBenchResult struct {
	rtt64, rtt4k, conc harness.Samples
	unix               harness.Samples // no interception, hop: 64 B over a Unix socket (unixref_bench_test.go)
	split              sysSplit        // hop: 64 B round trips split at the app's system calls (syscalls_bench_test.go)
	mbps               []float64       // bulk, one per run (whole path only)
	run64, runConc     []time.Duration // each run's own median, in repetition order
	ctr                fastpath.Counters
	runs               int
}

// fastpathBenchCmd runs the built `meshwire fastpath ARGS`; a non-zero exit
// is an error.
func fastpathBenchCmd(h *harness.H, args ...string) (string, error) {
	code, out, err := ie.Fastpath(h, args...)
	if err == nil && code != 0 {
		err = fmt.Errorf("meshwire fastpath %s: exit %d: %s", strings.Join(args, " "), code, out)
	}
	return out, err
}

func fastpathBenchStatus(b *testing.B, h *harness.H) fastpath.Status {
	b.Helper()
	st, err := ie.FastpathStatus(h)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// fastpathBenchRun runs one configuration once: a fresh pod and remote,
// the fast path attached if asked, the hop then the whole path.
func fastpathBenchRun(b *testing.B, h *harness.H, cfg fastpathBenchConfig, hop, whole *fastpathBenchResult) {
	e := ie.New(b, h)
	startRemoteEcho(e)
	if cfg.fast {
		// Detach on every way out of this function: a b.Fatal below
		// ends the goroutine through runtime.Goexit, which runs defers.
		defer func() {
			if _, err := fastpathBenchCmd(h, "detach"); err != nil {
				b.Error(err)
			}
		}()
		if _, err := fastpathBenchCmd(h, "attach"); err != nil {
			b.Fatal(err)
		}
		if cfg.pod {
			// What the chained intercept plugin writes at ADD for an
			// Istio pod (TestFastpathPodPolicy runs the plugin).
			err := netns.Enter(e.Pod.Path, func() error {
				_, err := podpolicy.Set("", podpolicy.Policy{IntoProxy: true})
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		if st := fastpathBenchStatus(b, h); !st.Attached || st.IntoProxy || st.PodPolicies != boolInt(cfg.pod) {
			b.Fatalf("%s: after attach, status says attached %v, into_proxy %v, %d pod policies", cfg.name, st.Attached, st.IntoProxy, st.PodPolicies)
		}
	}
	counters := func() fastpath.Counters {
		if !cfg.fast {
			return fastpath.Counters{}
		}
		return fastpathBenchStatus(b, h).Counters
	}
	check := func(path string, before, after fastpath.Counters) {
		if cfg.fast && after.RedirectedMessages <= before.RedirectedMessages {
			b.Fatalf("%s, %s: the fast path redirected nothing (redirected_messages %d before, %d after; counters after: %+v)",
				cfg.name, path, before.RedirectedMessages, after.RedirectedMessages, after)
		}
	}

	// The hop: the proxy echoes (-answer).
	var dst netip.AddrPort
	if cfg.mode == "" {
		e.StartProxy(true, "-answer")
		dst = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ie.ProxyInPort)
	} else {
		e.StartProxy(cfg.mode == "TPROXY", "-answer")
		if code, out := e.IptablesInit("-m", cfg.mode, "-i", "*", "-b", "*"); code != 0 {
			b.Fatalf("iptables-init -m %s: exit %d: %s", cfg.mode, code, out)
		}
		dst = ie.AP(ie.RemoteV4, ie.RemotePort)
	}
	waitSettled(b, cfg.name+", hop")
	before := counters()
	fastpathBenchRoundTrips(b, e, dst, hop)
	fastpathBenchSyscalls(b, e, dst, fastpathBenchWarmup, fastpathBenchRounds, &hop.split)
	after := counters()
	hop.ctr = hop.ctr.Add(after.Sub(before))
	hop.runs++
	check("hop", before, after)
	e.StopProxy()
	if cfg.mode == "" {
		unixRefHop(b, e, fastpathBenchWarmup, fastpathBenchRounds, &hop.unix)
	}

	// The whole path: the proxy forwards to the remote.
	if cfg.mode != "" {
		e.StartProxy(cfg.mode == "TPROXY")
	}
	waitSettled(b, cfg.name+", whole path")
	before = counters()
	fastpathBenchRoundTrips(b, e, ie.AP(ie.RemoteV4, ie.EchoPort), whole)
	whole.mbps = append(whole.mbps, fastpathBenchBulk(b, e))
	after = counters()
	whole.ctr = whole.ctr.Add(after.Sub(before))
	whole.runs++
	check("whole path", before, after)
	e.StopProxy()
	if cfg.mode != "" {
		if code, out := e.IptablesInit("--cleanup-only"); code != 0 {
			b.Fatalf("iptables-init --cleanup-only: exit %d: %s", code, out)
		}
	}
}

// startRemoteEcho starts the remote app's echo process on ie.EchoPort, as
// a user that is not the proxy (when the remote is meshed its sidecar
// forwards to it).
func startRemoteEcho(e *ie.Env) {
	e.StartEcho(e.Remote, ie.OtherUID, ie.OtherUID, "tcp", ":"+strconv.Itoa(ie.EchoPort))
}

// fastpathBenchRoundTrips measures 64 B and 4 KiB round trips on one
// connection and 64 B round trips on fastpathBenchConns connections at once,
// from the pod to dst.
func fastpathBenchRoundTrips(b *testing.B, e *ie.Env, dst netip.AddrPort, res *fastpathBenchResult) {
	n64, nConc := len(res.rtt64), len(res.conc)
	defer func() {
		res.run64 = append(res.run64, res.rtt64[n64:].Median())
		res.runConc = append(res.runConc, res.conc[nConc:].Median())
	}()
	c, err := ie.Dial(e.Pod, dst)
	if err != nil {
		b.Fatalf("dial %s: %v", dst, err)
	}
	r := bufio.NewReaderSize(c, 64<<10)
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	for _, m := range []struct {
		size int
		s    *harness.Samples
	}{{64, &res.rtt64}, {4096, &res.rtt4k}} {
		if err := fastpathBenchPingPong(c, r, fastpathBenchMsg(m.size), fastpathBenchWarmup, fastpathBenchRounds, m.s); err != nil {
			c.Close()
			b.Fatalf("%d B round trips to %s: %v", m.size, dst, err)
		}
	}
	c.Close()

	// Every connection warms up, then they all start their timed round
	// trips at once.
	var (
		mu    sync.Mutex
		errs  []error
		ready sync.WaitGroup
		done  sync.WaitGroup
		start = make(chan struct{})
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	msg := fastpathBenchMsg(64)
	for i := 0; i < fastpathBenchConns; i++ {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			c, err := ie.Dial(e.Pod, dst)
			if err != nil {
				ready.Done()
				fail(err)
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
			r := bufio.NewReaderSize(c, 4<<10)
			var s harness.Samples
			err = fastpathBenchPingPong(c, r, msg, fastpathBenchConnWarm, 0, &s)
			ready.Done()
			if err != nil {
				fail(err)
				return
			}
			<-start
			if err := fastpathBenchPingPong(c, r, msg, 0, fastpathBenchConnRTs, &s); err != nil {
				fail(err)
				return
			}
			mu.Lock()
			res.conc = append(res.conc, s...)
			mu.Unlock()
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	if len(errs) > 0 {
		b.Fatalf("%d of %d concurrent connections to %s failed, first: %v", len(errs), fastpathBenchConns, dst, errs[0])
	}
}

// fastpathBenchMsg is a request of size bytes, newline included.
func fastpathBenchMsg(size int) []byte {
	return append(bytes.Repeat([]byte("x"), size-1), '\n')
}

// fastpathBenchPingPong sends msg and reads the reply line warm+n times,
// recording the last n round trips. Every echo in play (the proxy's
// -answer, the remote's "WHO PEER MSG") ends its reply with the request.
func fastpathBenchPingPong(c net.Conn, r *bufio.Reader, msg []byte, warm, n int, s *harness.Samples) error {
	for i := 0; i < warm+n; i++ {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return fmt.Errorf("round trip %d: write: %w", i, err)
		}
		line, err := r.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("round trip %d: read: %w", i, err)
		}
		d := time.Since(start)
		if !bytes.HasSuffix(line, msg) {
			return fmt.Errorf("round trip %d: a reply of %d bytes that does not end with the %d-byte request", i, len(line), len(msg))
		}
		if i >= warm {
			*s = append(*s, d)
		}
	}
	return nil
}

// pingPong64 times warm+n 64 B round trips on c to what (fastpathBenchPingPong),
// recording the last n, and closes c.
func pingPong64(b *testing.B, c net.Conn, what string, warm, n int, s *harness.Samples) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	if err := fastpathBenchPingPong(c, bufio.NewReaderSize(c, 4<<10), fastpathBenchMsg(64), warm, n, s); err != nil {
		b.Fatalf("round trips to %s: %v", what, err)
	}
}

// fastpathBenchBulk pushes fastpathBenchBytes from the pod to the remote's
// sink in fastpathBenchWrite writes and returns MB/s, from the first write
// to the sink's count.
func fastpathBenchBulk(b *testing.B, e *ie.Env) float64 {
	sink, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, ie.SinkPort))
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	_ = sink.SetDeadline(time.Now().Add(2 * time.Minute))
	buf := make([]byte, fastpathBenchWrite)
	start := time.Now()
	for sent := 0; sent < fastpathBenchBytes; sent += len(buf) {
		if _, err := sink.Write(buf); err != nil {
			b.Fatalf("bulk write after %d bytes: %v", sent, err)
		}
	}
	_ = sink.CloseWrite()
	line, err := bufio.NewReader(sink).ReadString('\n')
	d := time.Since(start)
	if err != nil || strings.TrimSpace(line) != strconv.Itoa(fastpathBenchBytes) {
		b.Fatalf("bulk: the sink answered %q, %v (want %d)", line, err, fastpathBenchBytes)
	}
	return float64(fastpathBenchBytes) / 1e6 / d.Seconds()
}

func fastpathBenchUs(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }

func fastpathBenchMean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func fastpathBenchReport(b *testing.B, res map[string][]*fastpathBenchResult, reps int) {
	pathTitle := map[string]string{
		"hop":   "the app <-> sidecar hop alone (proxy -answer echoes; no interception: the same echo on 127.0.0.1:15006)",
		"whole": "the whole path app -> sidecar -> remote echo (no interception: app -> remote)",
	}
	type measure struct {
		name string
		get  func(*fastpathBenchResult) harness.Samples
		p95  bool
	}
	measures := []measure{
		{"64 B", func(r *fastpathBenchResult) harness.Samples { return r.rtt64 }, true},
		{"4 KiB", func(r *fastpathBenchResult) harness.Samples { return r.rtt4k }, true},
		{fmt.Sprintf("64 B, %d conns", fastpathBenchConns), func(r *fastpathBenchResult) harness.Samples { return r.conc }, false},
	}
	for _, path := range fastpathBenchPaths {
		rs := res[path]
		header := []string{"configuration"}
		for _, m := range measures {
			if m.p95 {
				header = append(header, m.name+" median / p95", "vs REDIRECT", "vs none")
			} else {
				header = append(header, m.name+" median", "vs REDIRECT", "vs none")
			}
		}
		tab := &harness.Table{
			Title: fmt.Sprintf("fast path, %s: request/response round trip, IPv4, µs (one connection: median / p95 of %d; %d connections at once: median of %d; %d runs per row, pooled)",
				pathTitle[path], fastpathBenchRounds*reps, fastpathBenchConns, fastpathBenchConns*fastpathBenchConnRTs*reps, reps),
			Header: header,
		}
		for i, cfg := range fastpathBenchConfigs {
			row := []string{cfg.name}
			for _, m := range measures {
				s := m.get(rs[i])
				cell := fastpathBenchUs(s.Median())
				if m.p95 {
					cell += " / " + fastpathBenchUs(s.P95())
				}
				row = append(row, cell,
					harness.Ratio(s.Median(), m.get(rs[fastpathBenchRedirect]).Median()),
					harness.Ratio(s.Median(), m.get(rs[fastpathBenchNone]).Median()))
			}
			tab.Add(row...)
		}
		tab.Write(os.Stdout)
	}

	whole := res["whole"]
	tp := &harness.Table{
		Title:  fmt.Sprintf("fast path: bulk throughput app -> sidecar -> remote sink, IPv4, one connection, %d MiB in %d KiB writes (MB/s, mean of %d runs)", fastpathBenchBytes>>20, fastpathBenchWrite>>10, reps),
		Header: []string{"configuration", "MB/s", "runs", "vs REDIRECT", "vs none"},
	}
	for i, cfg := range fastpathBenchConfigs {
		m := fastpathBenchMean(whole[i].mbps)
		runs := make([]string, len(whole[i].mbps))
		for j, v := range whole[i].mbps {
			runs[j] = fmt.Sprintf("%.0f", v)
		}
		tp.Add(cfg.name, fmt.Sprintf("%.0f", m), strings.Join(runs, ", "),
			fmt.Sprintf("%.2fx", m/fastpathBenchMean(whole[fastpathBenchRedirect].mbps)),
			fmt.Sprintf("%.2fx", m/fastpathBenchMean(whole[fastpathBenchNone].mbps)))
	}
	tp.Write(os.Stdout)

	sp := &harness.Table{
		Title:  "fast path: spread, each run's own round-trip median (µs, in repetition order; the order of the configurations is reversed every other repetition)",
		Header: []string{"configuration", "hop 64 B", fmt.Sprintf("hop 64 B, %d conns", fastpathBenchConns), "whole 64 B", fmt.Sprintf("whole 64 B, %d conns", fastpathBenchConns)},
	}
	runs := func(ds []time.Duration) string {
		out := make([]string, len(ds))
		for i, d := range ds {
			out[i] = fastpathBenchUs(d)
		}
		return strings.Join(out, ", ")
	}
	for i, cfg := range fastpathBenchConfigs {
		sp.Add(cfg.name, runs(res["hop"][i].run64), runs(res["hop"][i].runConc), runs(whole[i].run64), runs(whole[i].runConc))
	}
	sp.Write(os.Stdout)

	hs := &harness.Table{
		Title: fmt.Sprintf("fast path, the hop: where a 64 B round trip goes (µs, medians of %d; the app's write(2) and the read(2) that returned the reply, timed; the proxy's echo makes the same two calls; the rest is the processes waking up, being scheduled and running their own code)",
			fastpathBenchRounds*reps),
		Header: []string{"configuration", "round trip", "app's write", "app's read", "rest: round trip - 2 x (write + read)", "rest / REDIRECT's round trip"},
	}
	redirSplit := res["hop"][fastpathBenchRedirect].split.rtt.Median()
	for i, cfg := range fastpathBenchConfigs {
		sp := res["hop"][i].split
		hs.Add(cfg.name, fastpathBenchUs(sp.rtt.Median()), fastpathBenchUs(sp.w.Median()), fastpathBenchUs(sp.r.Median()), fastpathBenchUs(sp.rest.Median()), harness.Ratio(sp.rest.Median(), redirSplit))
	}
	hs.Write(os.Stdout)

	ct := &harness.Table{
		Title:  fmt.Sprintf("fast path counters (meshwire fastpath status --json, growth over each path's measurements, %d runs)", reps),
		Header: []string{"configuration", "path", "sockets", "pairs", "redirected messages", "redirected MB", "fallbacks", "kept for proxy", "ambiguous"},
	}
	for i, cfg := range fastpathBenchConfigs {
		if !cfg.fast {
			continue
		}
		for _, path := range fastpathBenchPaths {
			c := res[path][i].ctr
			ct.Add(cfg.name, path, fmt.Sprint(c.Sockets), fmt.Sprint(c.Pairs), fmt.Sprint(c.RedirectedMessages),
				fmt.Sprintf("%.1f", float64(c.RedirectedBytes)/1e6), fmt.Sprint(c.Fallbacks), fmt.Sprint(c.KeptForProxy), fmt.Sprint(c.Ambiguous))
		}
	}
	ct.Write(os.Stdout)

	tg := &harness.Table{
		Title:  "fast path: targets",
		Header: []string{"target", "configuration", "figure", "result"},
	}
	hop := res["hop"]
	redirHop := hop[fastpathBenchRedirect].rtt64.Median()
	unixHop := hop[fastpathBenchNone].unix.Median()
	for i, cfg := range fastpathBenchConfigs {
		if !cfg.pod {
			continue
		}
		d := hop[i].rtt64.Median()
		ratio := float64(d) / float64(redirHop)
		tg.Add("hop 64 B round trip <= 0.55x REDIRECT alone", cfg.name,
			fmt.Sprintf("%.2fx (%s µs vs %s µs; %s)", ratio, fastpathBenchUs(d), fastpathBenchUs(redirHop), unixRefFigure(unixHop, redirHop)), verdict(ratio <= 0.55))
	}
	redirTP := fastpathBenchMean(whole[fastpathBenchRedirect].mbps)
	for i, cfg := range fastpathBenchConfigs {
		if !cfg.pod {
			continue
		}
		m := fastpathBenchMean(whole[i].mbps)
		tg.Add("bulk throughput >= 1.5x REDIRECT alone", cfg.name,
			fmt.Sprintf("%.2fx (%.0f vs %.0f MB/s)", m/redirTP, m, redirTP), verdict(m/redirTP >= 1.5))
	}
	for _, m := range measures {
		none := m.get(whole[fastpathBenchNone]).Median()
		redir := m.get(whole[fastpathBenchRedirect]).Median()
		for i, cfg := range fastpathBenchConfigs {
			if !cfg.pod {
				continue
			}
			d := m.get(whole[i]).Median()
			closed, ok := "n/a", false
			if c, defined := gapClosed(d, redir, none); defined {
				closed, ok = fmt.Sprintf("%.0f%%", 100*c), c >= 0.25
			}
			tg.Add("whole path "+m.name+" round trip >= 25% of the way from REDIRECT alone to none", cfg.name,
				fmt.Sprintf("%s µs (none %s, REDIRECT %s; gap closed %s)", fastpathBenchUs(d), fastpathBenchUs(none), fastpathBenchUs(redir), closed),
				verdict(ok))
		}
	}
	tg.Write(os.Stdout)

	if os.Getenv("MESHWIRE_BENCH_PLOT") == "1" {
		root, err := harness.RepoRoot()
		if err != nil {
			b.Fatal(err)
		}
		out := filepath.Join(root, "docs", "fastpath-bench.svg")
		var panels []fastpathBenchPanel
		for _, path := range fastpathBenchPaths {
			for _, m := range measures {
				p := fastpathBenchPanel{title: map[string]string{"hop": "app <-> sidecar hop", "whole": "app -> sidecar -> remote"}[path] + ", " + m.name, unit: "µs"}
				for i := range fastpathBenchConfigs {
					p.values = append(p.values, float64(m.get(res[path][i]).Median())/1e3)
				}
				panels = append(panels, p)
			}
		}
		title := fmt.Sprintf("meshwire eBPF fast path: request/response round-trip medians, IPv4, µs (%d runs per bar, pooled)", reps)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(out, []byte(fastpathBenchSVG(title, panels, len(measures), fastpathBenchLegend(), fastpathBenchColors)), 0o644); err != nil {
			b.Fatal(err)
		}
		fmt.Printf("\nplot: %s\n", out)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fastpathBenchPanel is one bar chart: one bar per configuration.
type fastpathBenchPanel struct {
	title  string
	unit   string // of the y axis
	values []float64
}

func fastpathBenchLegend() []string {
	var names []string
	for _, c := range fastpathBenchConfigs {
		names = append(names, c.name)
	}
	return names
}

// fastpathBenchColors, one per configuration: grey for no interception,
// oranges for the rules alone, blues for the default fast path, greens for
// the Istio pod's policy (darker: REDIRECT, lighter: TPROXY).
var fastpathBenchColors = []string{"#9e9e9e", "#e6550d", "#fdae6b", "#3182bd", "#9ecae1", "#31a354", "#a1d99b"}

// fastpathBenchSVG draws the panels in a grid of cols columns, each with its
// own scale, the value over each bar, and a legend: bar i of each panel is
// legend[i], in colors[i].
func fastpathBenchSVG(title string, panels []fastpathBenchPanel, cols int, legend, colors []string) string {
	const (
		pw, ph      = 340, 250 // panel
		padL, padT  = 48, 34   // inside a panel: axis labels, title
		padB, padR  = 16, 10
		top, margin = 40, 20
		legendH     = 70
	)
	rows := (len(panels) + cols - 1) / cols
	width := margin*2 + cols*pw
	height := top + rows*ph + legendH
	var s strings.Builder
	esc := func(t string) string {
		return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(t)
	}
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n", width, height, width, height)
	fmt.Fprintf(&s, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&s, `<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", margin, esc(title))
	for n, p := range panels {
		x0 := margin + (n%cols)*pw
		y0 := top + (n/cols)*ph
		fmt.Fprintf(&s, `<text x="%d" y="%d" font-size="12" font-weight="bold">%s</text>`+"\n", x0+padL, y0+18, esc(p.title))
		max := 0.0
		for _, v := range p.values {
			max = math.Max(max, v)
		}
		step := fastpathBenchTick(max / 4)
		ymax := step * math.Ceil(max*1.12/step)
		if ymax == 0 {
			ymax = 1
		}
		plotH := float64(ph - padT - padB - 12)
		plotW := float64(pw - padL - padR - 10)
		base := float64(y0+padT) + plotH
		for v := 0.0; v <= ymax+step/2; v += step {
			y := base - v/ymax*plotH
			fmt.Fprintf(&s, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0+padL, y, float64(x0+padL)+plotW, y)
			fmt.Fprintf(&s, `<text x="%d" y="%.1f" font-size="10" text-anchor="end">%s</text>`+"\n", x0+padL-4, y+3, strconv.FormatFloat(v, 'f', -1, 64))
		}
		fmt.Fprintf(&s, `<text x="%d" y="%.1f" font-size="10" text-anchor="middle" transform="rotate(-90 %d %.1f)">%s</text>`+"\n", x0+12, base-plotH/2, x0+12, base-plotH/2, esc(p.unit))
		slot := plotW / float64(len(p.values))
		for i, v := range p.values {
			h := v / ymax * plotH
			bx := float64(x0+padL) + float64(i)*slot + slot*0.12
			fmt.Fprintf(&s, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%.1f %s</title></rect>`+"\n",
				bx, base-h, slot*0.76, h, colors[i%len(colors)], v, esc(p.unit))
			fmt.Fprintf(&s, `<text x="%.1f" y="%.1f" font-size="9" text-anchor="middle">%s</text>`+"\n", bx+slot*0.38, base-h-3, fastpathBenchLabel(v))
		}
		fmt.Fprintf(&s, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", x0+padL, base, float64(x0+padL)+plotW, base)
	}
	ly := top + rows*ph + 10
	for i, name := range legend {
		lx := margin + (i%4)*(width-2*margin)/4
		y := ly + (i/4)*22
		fmt.Fprintf(&s, `<rect x="%d" y="%d" width="14" height="14" fill="%s"/>`+"\n", lx, y, colors[i%len(colors)])
		fmt.Fprintf(&s, `<text x="%d" y="%d" font-size="12">%s</text>`+"\n", lx+20, y+12, esc(name))
	}
	s.WriteString("</svg>\n")
	return s.String()
}

// fastpathBenchTick rounds a step up to 1, 2 or 5 times a power of ten.
func fastpathBenchTick(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func fastpathBenchLabel(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
