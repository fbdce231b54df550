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
	"slices"
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
// connection), and bulk throughput with 64 KiB writes, with the CPU time
// per MB it cost, on both paths: the hop alone, app -> sidecar that sinks
// the bytes itself (the test proxy's -sink, which answers with their
// count; no interception: the same sink on 127.0.0.1:15006), and the whole
// path, app -> sidecar -> remote sink (the sink server counts the bytes).
//
// Every configuration runs once per placement per round
// (MESHWIRE_BENCH_ROUNDS, 10 by default; placement_bench_test.go): "one
// CPU", every process of the path (the benchmark's process, which is the
// app, the sidecar, the remote echo) pinned to one CPU, and "spread",
// wherever the scheduler puts them. The placements alternate from round to
// round, and so does the order of the configurations (reversed every other
// round); each run is in a fresh pod and remote and starts on a settled
// machine (harness.WaitIdle). A figure is the median of the rounds' own
// medians, with their min–max beside it. Beside each round-trip latency,
// the CPU time per request over the timed round trips (user + system of
// every process of the path and the softirq work done for it). A
// configuration with the fast path attaches it before its proxy starts
// (the fast path learns the sidecar's namespace when the proxy listens)
// and detaches it when it ends, also when it fails; it fails unless
// `meshwire fastpath status --json` shows redirected_messages grew on
// each path.
//
// Targets (met or not, printed; judged on "one CPU" and on CPU time per
// request, "spread" printed beside), for the Istio-pod rows (as deployed):
// hop 64 B round trip <= 0.55x of REDIRECT alone; the hop's bulk
// throughput >= 1.5x of REDIRECT alone (the whole path's bulk is printed
// beside it, not judged: on one CPU the sidecar's own TCP leg to the
// remote, which the fast path does not carry, bounds it); on the whole
// path the 64 B and 4 KiB round trips at least 30% of the way from
// REDIRECT alone to no interception; CPU time per request <= 0.6x of
// REDIRECT alone's on the hop, <= 0.8x on the whole path. The rows of a pod with no policy have no target: they are today's
// safe default, reported as they are.
//
// Plot: with MESHWIRE_BENCH_PLOT=1 the "one CPU" round-trip medians per
// configuration are also drawn to docs/fastpath-bench.svg (hand-written
// SVG); without it the benchmark writes nothing into the tree:
//
//	MESHWIRE_BENCH_PLOT=1 make bench BENCH=BenchmarkFastpath
func BenchmarkFastpath(b *testing.B) {
	h := harness.New(b)
	if st := fastpathBenchStatus(b, h); st.Attached {
		b.Fatalf("the fast path is already attached on this node (pins in %s): this benchmark attaches and detaches it itself and leaves alone one it did not attach", st.PinDir)
	}
	if f := os.Getenv(fastpathBenchInitFlagsEnv); f != "" {
		fmt.Printf("\nfast path: every intercepting configuration runs iptables-init with %s=%q added\n", fastpathBenchInitFlagsEnv, f)
	}
	meter := newCPUMeter(b)
	pls := placements()
	res := map[string]map[string][]*fastpathBenchResult{}
	for _, pl := range pls {
		res[pl.name] = map[string][]*fastpathBenchResult{}
		for _, path := range fastpathBenchPaths {
			res[pl.name][path] = make([]*fastpathBenchResult, len(fastpathBenchConfigs))
			for i := range fastpathBenchConfigs {
				res[pl.name][path][i] = &fastpathBenchResult{}
			}
		}
	}
	start := time.Now()
	rounds := inRounds(b, pls, len(fastpathBenchConfigs), func(pl placement, i int) {
		fastpathBenchRun(b, h, pathRun{placement: pl, m: meter}, fastpathBenchConfigs[i], res[pl.name]["hop"][i], res[pl.name]["whole"][i])
	})
	b.Logf("BenchmarkFastpath: %d rounds of %d configurations in %d placements in %s", rounds, len(fastpathBenchConfigs), len(pls), time.Since(start).Round(time.Second))
	fastpathBenchReport(b, res, pls, meter, rounds)
}

const (
	fastpathBenchWarmup   = 200       // round trips before the timed ones
	fastpathBenchRounds   = 2000      // timed round trips on one connection, per run
	fastpathBenchConns    = 50        // concurrent connections
	fastpathBenchConnWarm = 20        // round trips per connection before the timed ones
	fastpathBenchConnRTs  = 200       // timed round trips per connection, per run
	fastpathBenchBytes    = 256 << 20 // bulk bytes per run
	fastpathBenchWrite    = 64 << 10  // bulk write size
)

// fastpathBenchInitFlagsEnv names extra iptables-init flags for every
// intercepting configuration of a run, e.g. "--native-nftables" to
// measure the rules as native nftables tables rather than through the
// iptables variant the pod would get by default (iptables-nft here).
const fastpathBenchInitFlagsEnv = "MESHWIRE_BENCH_INIT_FLAGS"

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

// fastpathBenchResult is one configuration on one path in one placement:
// one value per round, except where pooled.
type fastpathBenchResult struct {
	rtt64, rtt4k, conc rounds          // each round's median round trip
	cpu64, cpu4k       rounds          // each round's CPU time per request
	mbps               []float64       // bulk MB/s, one per round
	cpuMB              []float64       // bulk CPU µs per MB, one per round
	unix               harness.Samples // no interception, hop: 64 B over a Unix socket (unixref_bench_test.go), pooled
	split              sysSplit        // hop: 64 B round trips split at the app's system calls (syscalls_bench_test.go), pooled
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

// fastpathBenchRun runs one configuration once in placement pr: a fresh
// pod and remote, the fast path attached if asked, the hop then the whole
// path.
func fastpathBenchRun(b *testing.B, h *harness.H, pr pathRun, cfg fastpathBenchConfig, hop, whole *fastpathBenchResult) {
	e := ie.New(b, h)
	echo := startRemoteEcho(e)
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
		args := append([]string{"-m", cfg.mode, "-i", "*", "-b", "*"}, strings.Fields(os.Getenv(fastpathBenchInitFlagsEnv))...)
		if code, out := e.IptablesInit(args...); code != 0 {
			b.Fatalf("iptables-init %s: exit %d: %s", strings.Join(args, " "), code, out)
		}
		dst = ie.AP(ie.RemoteV4, ie.RemotePort)
	}
	checkPlaced(b, pr.placement, cfg.name, echo.Pid(), e.Proxy.Pid())
	waitSettled(b, cfg.name+", hop")
	before := counters()
	fastpathBenchRoundTrips(b, pr.on(cfg.name, "hop"), e, dst, hop)
	fastpathBenchSyscalls(b, e, dst, fastpathBenchWarmup, fastpathBenchRounds, &hop.split)
	e.StopProxy()
	if cfg.mode == "" {
		unixRefHop(b, e, fastpathBenchWarmup, fastpathBenchRounds, &hop.unix)
	}

	// The hop's bulk: the proxy sinks the bytes itself (-sink) and
	// answers with their count. With no interception the app sends to
	// the same program on 127.0.0.1:15006, as for the round trips.
	sinkDst := ie.AP(ie.RemoteV4, ie.SinkPort)
	if cfg.mode == "" {
		e.StartProxy(true, "-sink")
		sinkDst = dst
	} else {
		e.StartProxy(cfg.mode == "TPROXY", "-sink")
	}
	checkPlaced(b, pr.placement, cfg.name, e.Proxy.Pid())
	waitSettled(b, cfg.name+", hop bulk")
	mbps, cpuMB := fastpathBenchBulk(b, pr, e, sinkDst)
	hop.mbps, hop.cpuMB = append(hop.mbps, mbps), append(hop.cpuMB, cpuMB)
	after := counters()
	hop.ctr = hop.ctr.Add(after.Sub(before))
	hop.runs++
	check("hop", before, after)
	e.StopProxy()

	// The whole path: the proxy forwards to the remote.
	if cfg.mode != "" {
		e.StartProxy(cfg.mode == "TPROXY")
		checkPlaced(b, pr.placement, cfg.name, e.Proxy.Pid())
	}
	waitSettled(b, cfg.name+", whole path")
	before = counters()
	fastpathBenchRoundTrips(b, pr.on(cfg.name, "whole"), e, ie.AP(ie.RemoteV4, ie.EchoPort), whole)
	mbps, cpuMB = fastpathBenchBulk(b, pr, e, ie.AP(ie.RemoteV4, ie.SinkPort))
	whole.mbps, whole.cpuMB = append(whole.mbps, mbps), append(whole.cpuMB, cpuMB)
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
func startRemoteEcho(e *ie.Env) *ie.Proxy {
	return e.StartEcho(e.Remote, ie.OtherUID, ie.OtherUID, "tcp", ":"+strconv.Itoa(ie.EchoPort))
}

// fastpathBenchRoundTrips measures 64 B and 4 KiB round trips on one
// connection, each size's median and CPU time per request over its timed
// round trips, and 64 B round trips on fastpathBenchConns connections at
// once, from the pod to dst.
func fastpathBenchRoundTrips(b *testing.B, pr pathRun, e *ie.Env, dst netip.AddrPort, res *fastpathBenchResult) {
	c, err := ie.Dial(e.Pod, dst)
	if err != nil {
		b.Fatalf("dial %s: %v", dst, err)
	}
	r := bufio.NewReaderSize(c, 64<<10)
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	for _, m := range []struct {
		size     int
		rtt, cpu *rounds
	}{{64, &res.rtt64, &res.cpu64}, {4096, &res.rtt4k, &res.cpu4k}} {
		rtt, cpu, err := timedPingPong(b, pr, c, r, fastpathBenchMsg(m.size), fastpathBenchWarmup, fastpathBenchRounds)
		if err != nil {
			c.Close()
			b.Fatalf("%d B round trips to %s: %v", m.size, dst, err)
		}
		*m.rtt, *m.cpu = append(*m.rtt, rtt), append(*m.cpu, cpu)
	}
	c.Close()

	// Every connection warms up, then they all start their timed round
	// trips at once.
	var (
		mu    sync.Mutex
		conc  harness.Samples
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
			conc = append(conc, s...)
			mu.Unlock()
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	if len(errs) > 0 {
		b.Fatalf("%d of %d concurrent connections to %s failed, first: %v", len(errs), fastpathBenchConns, dst, errs[0])
	}
	res.conc = append(res.conc, conc.Median())
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

// timedPingPong makes warm round trips of msg on c, then n timed ones,
// and returns their median and the CPU time per request they cost.
func timedPingPong(b *testing.B, pr pathRun, c net.Conn, r *bufio.Reader, msg []byte, warm, n int) (median, cpu time.Duration, err error) {
	var s harness.Samples
	if err := fastpathBenchPingPong(c, r, msg, warm, 0, &s); err != nil {
		return 0, 0, err
	}
	profiled(b, fmt.Sprintf("%s/%s/%d B", pr.name, pr.label, len(msg)), func() {
		cpu = pr.cpu(b, n, func() { err = fastpathBenchPingPong(c, r, msg, 0, n, &s) })
	})
	return s.Median(), cpu, err
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

// fastpathBenchBulk pushes fastpathBenchBytes from the pod to the sink at
// dst (the remote's, or the sidecar's own with -sink) in
// fastpathBenchWrite writes and returns MB/s, from the first write to the
// sink's count, and the CPU µs per MB that cost (every process of the
// path, as for a request).
func fastpathBenchBulk(b *testing.B, pr pathRun, e *ie.Env, dst netip.AddrPort) (mbps, cpuPerMB float64) {
	sink, err := ie.Dial(e.Pod, dst)
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	_ = sink.SetDeadline(time.Now().Add(2 * time.Minute))
	buf := make([]byte, fastpathBenchWrite)
	var d time.Duration
	cpu := pr.cpu(b, 1, func() {
		start := time.Now()
		for sent := 0; sent < fastpathBenchBytes; sent += len(buf) {
			if _, err := sink.Write(buf); err != nil {
				b.Fatalf("bulk to %s: write after %d bytes: %v", dst, sent, err)
			}
		}
		_ = sink.CloseWrite()
		line, err := bufio.NewReader(sink).ReadString('\n')
		d = time.Since(start)
		if err != nil || strings.TrimSpace(line) != strconv.Itoa(fastpathBenchBytes) {
			b.Fatalf("bulk to %s: the sink answered %q, %v (want %d)", dst, line, err, fastpathBenchBytes)
		}
	})
	mb := float64(fastpathBenchBytes) / 1e6
	return mb / d.Seconds(), float64(cpu.Microseconds()) / mb
}

// fastpathBenchFloatCell is "median [min–max]" of per-round values.
func fastpathBenchFloatCell(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f [%.0f–%.0f]", floatMedian(v), slices.Min(v), slices.Max(v))
}

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

// fastpathBenchMeasure is one round-trip figure of a path: each round's
// median, and (where measured) its CPU time per request.
type fastpathBenchMeasure struct {
	name string
	rtt  func(*fastpathBenchResult) rounds
	cpu  func(*fastpathBenchResult) rounds // nil: not measured
}

var fastpathBenchMeasures = []fastpathBenchMeasure{
	{"64 B", func(r *fastpathBenchResult) rounds { return r.rtt64 }, func(r *fastpathBenchResult) rounds { return r.cpu64 }},
	{"4 KiB", func(r *fastpathBenchResult) rounds { return r.rtt4k }, func(r *fastpathBenchResult) rounds { return r.cpu4k }},
	{fmt.Sprintf("64 B, %d conns", fastpathBenchConns), func(r *fastpathBenchResult) rounds { return r.conc }, nil},
}

// The indexes of fastpathBenchMeasures the whole path's targets judge.
var fastpathBenchJudged = []int{0, 1}

func fastpathBenchReport(b *testing.B, res map[string]map[string][]*fastpathBenchResult, pls []placement, meter *cpuMeter, nRounds int) {
	pathTitle := map[string]string{
		"hop":   "the app <-> sidecar hop alone (proxy -answer echoes; no interception: the same echo on 127.0.0.1:15006)",
		"whole": "the whole path app -> sidecar -> remote echo (no interception: app -> remote)",
	}
	for _, pl := range pls {
		rp := res[pl.name]
		for _, path := range fastpathBenchPaths {
			rs := rp[path]
			header := []string{"configuration"}
			for _, m := range fastpathBenchMeasures {
				header = append(header, m.name+" µs", "vs REDIRECT", "vs none")
				if m.cpu != nil {
					header = append(header, m.name+" CPU µs/request", "vs REDIRECT")
				}
			}
			tab := &harness.Table{
				Title: fmt.Sprintf("fast path, %s, %s: request/response round trip, IPv4: median of %d rounds' medians [min–max] (one connection: %d round trips per round; %d connections at once: %d each). %s",
					pl.name, pathTitle[path], nRounds, fastpathBenchRounds, fastpathBenchConns, fastpathBenchConnRTs, meter.method()),
				Header: header,
			}
			for i, cfg := range fastpathBenchConfigs {
				row := []string{cfg.name}
				for _, m := range fastpathBenchMeasures {
					d := m.rtt(rs[i])
					row = append(row, spreadCell(d),
						harness.Ratio(d.Median(), m.rtt(rs[fastpathBenchRedirect]).Median()),
						harness.Ratio(d.Median(), m.rtt(rs[fastpathBenchNone]).Median()))
					if m.cpu != nil {
						c := m.cpu(rs[i])
						row = append(row, spreadCell(c), harness.Ratio(c.Median(), m.cpu(rs[fastpathBenchRedirect]).Median()))
					}
				}
				tab.Add(row...)
			}
			tab.Write(os.Stdout)
		}

		tp := &harness.Table{
			Title: fmt.Sprintf("fast path, %s: bulk throughput, IPv4, one connection, %d MiB in %d KiB writes (MB/s and CPU µs per MB, median of %d rounds [min–max]): the hop alone, app -> sidecar that sinks the bytes (proxy -sink; no interception: the same sink on 127.0.0.1:15006), judged; and the whole path app -> sidecar -> remote sink, not judged (on one CPU its throughput is bounded by the sidecar's own TCP leg to the remote, which the fast path does not carry)",
				pl.name, fastpathBenchBytes>>20, fastpathBenchWrite>>10, nRounds),
			Header: []string{"configuration", "hop MB/s", "vs REDIRECT", "vs none", "hop CPU µs/MB", "vs REDIRECT", "whole path MB/s", "vs REDIRECT", "vs none", "whole path CPU µs/MB", "vs REDIRECT"},
		}
		for i, cfg := range fastpathBenchConfigs {
			row := []string{cfg.name}
			for _, path := range fastpathBenchPaths {
				v, redir, none := rp[path][i].mbps, floatMedian(rp[path][fastpathBenchRedirect].mbps), floatMedian(rp[path][fastpathBenchNone].mbps)
				c, redirC := rp[path][i].cpuMB, floatMedian(rp[path][fastpathBenchRedirect].cpuMB)
				row = append(row, fastpathBenchFloatCell(v), fmt.Sprintf("%.2fx", floatMedian(v)/redir), fmt.Sprintf("%.2fx", floatMedian(v)/none),
					fastpathBenchFloatCell(c), fmt.Sprintf("%.2fx", floatMedian(c)/redirC))
			}
			tp.Add(row...)
		}
		tp.Write(os.Stdout)

		hs := &harness.Table{
			Title: fmt.Sprintf("fast path, %s, the hop: where a 64 B round trip goes (µs, medians of %d pooled; the app's write(2) and the read(2) that returned the reply, timed; the proxy's echo makes the same two calls; the rest is the processes waking up, being scheduled and running their own code)",
				pl.name, fastpathBenchRounds*nRounds),
			Header: []string{"configuration", "round trip", "app's write", "app's read", "rest: round trip - 2 x (write + read)", "rest / REDIRECT's round trip"},
		}
		redirSplit := rp["hop"][fastpathBenchRedirect].split.rtt.Median()
		for i, cfg := range fastpathBenchConfigs {
			sp := rp["hop"][i].split
			hs.Add(cfg.name, fastpathBenchUs(sp.rtt.Median()), fastpathBenchUs(sp.w.Median()), fastpathBenchUs(sp.r.Median()), fastpathBenchUs(sp.rest.Median()), harness.Ratio(sp.rest.Median(), redirSplit))
		}
		hs.Write(os.Stdout)

		ct := &harness.Table{
			Title:  fmt.Sprintf("fast path counters, %s (meshwire fastpath status --json, growth over each path's measurements, %d rounds)", pl.name, nRounds),
			Header: []string{"configuration", "path", "sockets", "pairs", "redirected messages", "redirected MB", "fallbacks", "kept for proxy", "ambiguous"},
		}
		for i, cfg := range fastpathBenchConfigs {
			if !cfg.fast {
				continue
			}
			for _, path := range fastpathBenchPaths {
				c := rp[path][i].ctr
				ct.Add(cfg.name, path, fmt.Sprint(c.Sockets), fmt.Sprint(c.Pairs), fmt.Sprint(c.RedirectedMessages),
					fmt.Sprintf("%.1f", float64(c.RedirectedBytes)/1e6), fmt.Sprint(c.Fallbacks), fmt.Sprint(c.KeptForProxy), fmt.Sprint(c.Ambiguous))
			}
		}
		ct.Write(os.Stdout)
	}

	for _, pl := range pls {
		er := newEveryRound("fast path, "+pl.name, nRounds)
		for i, cfg := range fastpathBenchConfigs {
			hop, whole := res[pl.name]["hop"][i], res[pl.name]["whole"][i]
			er.add(cfg.name, "hop 64 B µs", microseconds(hop.rtt64), oneDecimal)
			er.add(cfg.name, "hop 64 B CPU µs/request", microseconds(hop.cpu64), oneDecimal)
			er.add(cfg.name, "hop bulk MB/s", hop.mbps, noDecimal)
			er.add(cfg.name, "hop bulk CPU µs/MB", hop.cpuMB, noDecimal)
			for _, k := range fastpathBenchJudged {
				m := fastpathBenchMeasures[k]
				er.add(cfg.name, "whole "+m.name+" µs", microseconds(m.rtt(whole)), oneDecimal)
				er.add(cfg.name, "whole "+m.name+" CPU µs/request", microseconds(m.cpu(whole)), oneDecimal)
			}
			er.add(cfg.name, "whole bulk MB/s", whole.mbps, noDecimal)
			er.add(cfg.name, "whole bulk CPU µs/MB", whole.cpuMB, noDecimal)
		}
		er.write()
	}

	tg := newTargets("fast path: targets, the Istio pod (as the DaemonSet ships it)", pls, nRounds)
	redirOf := func(pl, path string) *fastpathBenchResult { return res[pl][path][fastpathBenchRedirect] }
	noneOf := func(pl, path string) *fastpathBenchResult { return res[pl][path][fastpathBenchNone] }
	// ratio is a latency or CPU figure of configuration i against
	// REDIRECT alone's, round by round.
	ratio := func(x, base []float64, medians string) figure {
		return figure{paired: pairedRatios(x, base), medians: medians, groups: roundGroups(x, "REDIRECT", base, "µs", oneDecimal, false)}
	}
	for i, cfg := range fastpathBenchConfigs {
		if !cfg.pod {
			continue
		}
		tg.judge("hop 64 B round trip <= 0.55x REDIRECT alone", cfg.name, atMost(0.55), func(pl string) figure {
			hop, redir := res[pl]["hop"][i], redirOf(pl, "hop")
			d, r := hop.rtt64.Median(), redir.rtt64.Median()
			return ratio(microseconds(hop.rtt64), microseconds(redir.rtt64),
				fmt.Sprintf("%s (%s vs %s µs; %s)", harness.Ratio(d, r), fastpathBenchUs(d), fastpathBenchUs(r), unixRefFigure(noneOf(pl, "hop").unix.Median(), r)))
		})
		bulk := func(pl, path string) figure {
			x, redir := res[pl][path][i], redirOf(pl, path)
			m, r := floatMedian(x.mbps), floatMedian(redir.mbps)
			c, rc := floatMedian(x.cpuMB), floatMedian(redir.cpuMB)
			return figure{
				paired:  pairedRatios(x.mbps, redir.mbps),
				medians: fmt.Sprintf("%.2fx (%.0f vs %.0f MB/s; CPU %.2fx: %.0f vs %.0f µs per MB)", m/r, m, r, c/rc, c, rc),
				groups:  roundGroups(x.mbps, "REDIRECT", redir.mbps, "MB/s", noDecimal, true),
			}
		}
		tg.judge("bulk throughput, the hop (app -> sidecar sink) >= 1.5x REDIRECT alone", cfg.name, atLeast(1.5), func(pl string) figure { return bulk(pl, "hop") })
		tg.beside("bulk throughput, the whole path (app -> sidecar -> remote sink), beside the hop's", cfg.name, atLeast(0), func(pl string) figure { return bulk(pl, "whole") })
		for _, k := range fastpathBenchJudged {
			m := fastpathBenchMeasures[k]
			tg.judge("whole path "+m.name+" round trip >= 30% of the way from REDIRECT alone to none", cfg.name, shareAtLeast(0.3), func(pl string) figure {
				x, redir, none := microseconds(m.rtt(res[pl]["whole"][i])), microseconds(m.rtt(redirOf(pl, "whole"))), microseconds(m.rtt(noneOf(pl, "whole")))
				text, _ := gapFigure(m.rtt(res[pl]["whole"][i]).Median(), m.rtt(redirOf(pl, "whole")).Median(), m.rtt(noneOf(pl, "whole")).Median(), 0.3)
				return figure{paired: pairedGaps(x, redir, none), medians: text, groups: roundGroups(x, "REDIRECT", redir, "µs", oneDecimal, false)}
			})
		}
		tg.judge("CPU time per request, hop 64 B <= 0.6x REDIRECT alone", cfg.name, atMost(0.6), func(pl string) figure {
			hop, redir := res[pl]["hop"][i], redirOf(pl, "hop")
			text, _ := cpuFigure(hop.cpu64.Median(), redir.cpu64.Median(), 0.6)
			return ratio(microseconds(hop.cpu64), microseconds(redir.cpu64), text)
		})
		for _, k := range fastpathBenchJudged {
			m := fastpathBenchMeasures[k]
			tg.judge("CPU time per request, whole path "+m.name+" <= 0.8x REDIRECT alone", cfg.name, atMost(0.8), func(pl string) figure {
				x, redir := m.cpu(res[pl]["whole"][i]), m.cpu(redirOf(pl, "whole"))
				text, _ := cpuFigure(x.Median(), redir.Median(), 0.8)
				return ratio(microseconds(x), microseconds(redir), text)
			})
		}
	}
	tg.write()

	if os.Getenv("MESHWIRE_BENCH_PLOT") == "1" {
		root, err := harness.RepoRoot()
		if err != nil {
			b.Fatal(err)
		}
		out := filepath.Join(root, "docs", "fastpath-bench.svg")
		var panels []fastpathBenchPanel
		for _, path := range fastpathBenchPaths {
			for _, m := range fastpathBenchMeasures {
				p := fastpathBenchPanel{title: map[string]string{"hop": "app <-> sidecar hop", "whole": "app -> sidecar -> remote"}[path] + ", " + m.name, unit: "µs"}
				for i := range fastpathBenchConfigs {
					p.values = append(p.values, float64(m.rtt(res[pls[0].name][path][i]).Median())/1e3)
				}
				panels = append(panels, p)
			}
		}
		title := fmt.Sprintf("meshwire eBPF fast path: request/response round trips, %s, IPv4, µs (median of %d rounds per bar)", pls[0].name, nRounds)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(out, []byte(fastpathBenchSVG(title, panels, len(fastpathBenchMeasures), fastpathBenchLegend(), fastpathBenchColors)), 0o644); err != nil {
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
