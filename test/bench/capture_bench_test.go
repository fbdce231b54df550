//go:build kernel

package bench

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/meshwire/meshwire/ebpf/capture"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// BenchmarkCapture measures EBPF interception mode (connect-time hooks, no
// netfilter in the pod) side by side in one run with no interception (the
// limit), the REDIRECT and TPROXY rules, and each with the fast path
// attached for an Istio pod (its proxy fed, as the chained intercept plugin
// writes the policy):
//
//   - conntrack entries per proxied connection in the pod's namespace,
//     after captureBenchConns connections app -> sidecar -> remote (each
//     one request);
//   - connection setup rate through the sidecar: those connections, made by
//     captureBenchWorkers at once, each a new connection, one 64 B request
//     and its reply, then close (connections per second);
//   - the app <-> sidecar hop: 64 B round trips on one connection to a
//     captured destination that the test proxy answers itself (-answer;
//     with no interception the same proxy program on 127.0.0.1:15006);
//   - sidecar to sidecar on one node: the remote namespace is made a meshed
//     pod of its own (the same mode, its own test proxy), so a request goes
//     app -> sidecar -> remote's sidecar -> remote's app and back; 64 B
//     round trips on one connection (no interception: app -> remote app);
//     the remote's app is an echo process of its own (startRemoteEcho);
//   - with no interception, the hop and sidecar to sidecar also over Unix
//     sockets between the same processes (unixref_bench_test.go), stated
//     beside their targets;
//   - pod ADD time of the chained intercept plugin through libcni
//     (loopback + intercept, an Istio pod's annotations, the mode from
//     meshwire's annotation), REDIRECT against EBPF, each ADD followed by
//     its DEL, alternating.
//
// Every configuration runs once per placement ("one CPU": every process of
// the path pinned to one CPU; "spread": wherever the scheduler puts them;
// placement_bench_test.go) per round (MESHWIRE_BENCH_ROUNDS, 10 by
// default), each run in a fresh pod and remote, the placements and the
// order of the configurations alternating from round to round, each run
// starting on a settled machine. A round-trip figure is the median of the
// rounds' medians with their min–max, beside the CPU time per request over
// the timed round trips. A run in EBPF mode fails unless the pod's
// namespace has no conntrack entry, nftables rule or iptables table after
// its traffic; a run with the fast path fails unless it redirected
// messages.
//
// Targets (met or not, printed; round trips and CPU time judged on "one
// CPU", "spread" printed beside): EBPF mode leaves 0 conntrack entries per
// connection; its ADD is no slower than REDIRECT's (median); its
// connection rate is at least REDIRECT's; with the fast path, the hop's
// 64 B round trip is at most 0.5x REDIRECT alone's and its CPU time per
// request at most 0.6x, and sidecar to sidecar (app, sidecar, sidecar,
// app) the round trip is at least 35% of the way from REDIRECT to no mesh
// and its CPU time per request at most 0.8x REDIRECT's.
//
// With MESHWIRE_BENCH_PLOT=1 the figures are also drawn to
// docs/capture-bench.svg:
//
//	MESHWIRE_BENCH_PLOT=1 make bench BENCH=BenchmarkCapture
func BenchmarkCapture(b *testing.B) {
	h := harness.New(b)
	if st := fastpathBenchStatus(b, h); st.Attached || capture.IsAttached("") {
		b.Fatalf("the fast path or the ebpf interception programs are already attached on this node: this benchmark attaches and detaches them itself")
	}
	meter := newCPUMeter(b)
	pls := placements()
	res := map[string][]*captureBenchResult{}
	for _, pl := range pls {
		res[pl.name] = make([]*captureBenchResult, len(captureBenchConfigs))
		for i := range res[pl.name] {
			res[pl.name][i] = &captureBenchResult{}
		}
	}
	start := time.Now()
	nRounds := inRounds(b, pls, len(captureBenchConfigs), func(pl placement, i int) {
		captureBenchRun(b, h, pathRun{placement: pl, m: meter}, captureBenchConfigs[i], res[pl.name][i])
	})
	adds := captureBenchAdds(b, h)
	b.Logf("BenchmarkCapture: %d rounds of %d configurations in %d placements and %d ADDs per mode in %s", nRounds, len(captureBenchConfigs), len(pls), captureBenchAddN*b.N, time.Since(start).Round(time.Second))
	captureBenchReport(b, res, pls, meter, adds, nRounds)
}

const (
	captureBenchConns   = 1000 // connections per run, conntrack and rate
	captureBenchWorkers = 4    // connecting at once
	captureBenchWarmup  = 200  // round trips before the timed ones
	captureBenchRounds  = 2000 // timed round trips per run
	captureBenchAddN    = 30   // ADDs (and DELs) per mode
)

type captureBenchConfig struct {
	name string
	mode string // "" (no interception), "REDIRECT", "TPROXY" or "EBPF"
	fast bool   // the fast path attached, the pods' proxies fed
}

var captureBenchConfigs = []captureBenchConfig{
	{name: "no interception"},
	{name: "REDIRECT", mode: "REDIRECT"},
	{name: "TPROXY", mode: "TPROXY"},
	{name: "EBPF", mode: "EBPF"},
	{name: "REDIRECT + fast path", mode: "REDIRECT", fast: true},
	{name: "EBPF + fast path", mode: "EBPF", fast: true},
}

// The indexes the ratios and targets use.
const (
	captureBenchNone     = 0
	captureBenchRedirect = 1
)

// captureBenchColors: grey for none, oranges for the rules, purple for
// EBPF mode, green and blue with the fast path.
var captureBenchColors = []string{"#9e9e9e", "#e6550d", "#fdae6b", "#756bb1", "#31a354", "#3182bd"}

type captureBenchResult struct {
	conntrack      []float64 // entries per connection, one per round
	rate           []float64 // connections per second, one per round
	hop, s2s       rounds    // each round's median round trip
	hopCPU, s2sCPU rounds    // each round's CPU time per request
	// no interception only: the hop and sidecar to sidecar over Unix
	// sockets (unixref_bench_test.go)
	unixHop, unixS2S harness.Samples
}

var captureBenchFlows = regexp.MustCompile(`(\d+) flow entries have been shown`)

// captureBenchConntrack counts the conntrack entries in ns.
func captureBenchConntrack(b *testing.B, ns *harness.NS) int {
	out, err := ns.Exec("conntrack", "-L")
	m := captureBenchFlows.FindStringSubmatch(out)
	if err != nil || m == nil {
		b.Fatalf("conntrack -L in %s: %v\n%s", ns.Name, err, out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// captureBenchMesh makes ns a meshed pod in cfg's mode (iptables-init; an
// Istio pod's fast-path policy with the fast path). Its sidecar is started
// apart (captureBenchProxy), so that it can be replaced.
func captureBenchMesh(b *testing.B, e *ie.Env, ns *harness.NS, cfg captureBenchConfig) {
	if code, out := e.IptablesInitIn(ns, nil, "-m", cfg.mode, "-i", "*", "-b", "*"); code != 0 {
		b.Fatalf("%s: iptables-init -m %s in %s: exit %d: %s", cfg.name, cfg.mode, ns.Name, code, out)
	}
	if cfg.fast {
		err := netns.Enter(ns.Path, func() error {
			_, err := podpolicy.Set("", podpolicy.Policy{IntoProxy: true})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// captureBenchProxy starts ns's sidecar for cfg (transparent for TPROXY).
func captureBenchProxy(e *ie.Env, ns *harness.NS, cfg captureBenchConfig, args ...string) *ie.Proxy {
	return e.StartProxyIn(ns, ie.ProxyUID, ie.ProxyUID, cfg.mode == "TPROXY", args...)
}

// captureBenchUnmesh removes ns's interception (its EBPF registration).
func captureBenchUnmesh(b *testing.B, e *ie.Env, ns *harness.NS, cfg captureBenchConfig) {
	if code, out := e.IptablesInitIn(ns, nil, "--cleanup-only"); code != 0 {
		b.Fatalf("%s: iptables-init --cleanup-only in %s: exit %d: %s", cfg.name, ns.Name, code, out)
	}
}

// captureBenchAttach attaches what cfg needs and returns what detaches it:
// the fast path with the interception programs (`meshwire fastpath
// attach`), or for EBPF mode alone the interception programs only.
func captureBenchAttach(b *testing.B, h *harness.H, cfg captureBenchConfig) func() {
	switch {
	case cfg.fast:
		if _, err := fastpathBenchCmd(h, "attach"); err != nil {
			b.Fatal(err)
		}
		return func() {
			if _, err := fastpathBenchCmd(h, "detach"); err != nil {
				b.Error(err)
			}
		}
	case cfg.mode == "EBPF":
		if _, err := capture.Attach("", ""); err != nil {
			b.Fatal(err)
		}
		return func() {
			if _, err := capture.Detach("", false); err != nil {
				b.Error(err)
			}
		}
	}
	return func() {}
}

// captureBenchRun runs one configuration once in a fresh pod and remote.
func captureBenchRun(b *testing.B, h *harness.H, pr pathRun, cfg captureBenchConfig, res *captureBenchResult) {
	e := ie.New(b, h)
	echo := startRemoteEcho(e)
	// Detached on every way out, also a b.Fatal (runtime.Goexit runs
	// defers); the namespaces' registrations go before (defers run last
	// first).
	defer captureBenchAttach(b, h, cfg)()
	defer e.StopProxy()
	meshed := cfg.mode != ""
	before := fastpathBenchStatus(b, h).Counters
	if meshed {
		captureBenchMesh(b, e, e.Pod, cfg)
		defer captureBenchUnmesh(b, e, e.Pod, cfg)
	}

	// Conntrack and connection rate: app -> sidecar -> remote.
	if meshed {
		e.Proxy = captureBenchProxy(e, e.Pod, cfg)
	}
	waitSettled(b, cfg.name+", connections")
	res.rate = append(res.rate, captureBenchConnect(b, e.Pod, ie.AP(ie.RemoteV4, ie.RemotePort)))
	res.conntrack = append(res.conntrack, float64(captureBenchConntrack(b, e.Pod))/captureBenchConns)
	e.StopProxy()

	// The hop: the pod's proxy answers itself.
	hopDst := ie.AP(ie.RemoteV4, ie.RemotePort)
	if meshed {
		e.Proxy = captureBenchProxy(e, e.Pod, cfg, "-answer")
	} else {
		e.StartProxy(true, "-answer")
		hopDst = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ie.ProxyInPort)
	}
	checkPlaced(b, pr.placement, cfg.name, echo.Pid(), e.Proxy.Pid())
	waitSettled(b, cfg.name+", hop")
	captureBenchRoundTrips(b, pr.on(cfg.name, "hop"), e.Pod, hopDst, &res.hop, &res.hopCPU)
	e.StopProxy()
	if !meshed {
		unixRefHop(b, e, captureBenchWarmup, captureBenchRounds, &res.unixHop)
		unixRefChain(b, e, captureBenchWarmup, captureBenchRounds, &res.unixS2S)
	}

	// Sidecar to sidecar: the remote meshed too.
	if meshed {
		e.Proxy = captureBenchProxy(e, e.Pod, cfg)
		captureBenchMesh(b, e, e.Remote, cfg)
		defer captureBenchUnmesh(b, e, e.Remote, cfg)
		remote := captureBenchProxy(e, e.Remote, cfg)
		defer remote.Stop()
		checkPlaced(b, pr.placement, cfg.name, e.Proxy.Pid(), remote.Pid())
	}
	waitSettled(b, cfg.name+", sidecar to sidecar")
	peers := fastpathBenchStatus(b, h).PeerPairs
	captureBenchRoundTrips(b, pr.on(cfg.name, "s2s"), e.Pod, ie.AP(ie.RemoteV4, ie.EchoPort), &res.s2s, &res.s2sCPU)
	if cfg.fast && fastpathBenchStatus(b, h).PeerPairs == peers {
		b.Fatalf("%s: the two sidecars' connection was not paired", cfg.name)
	}

	if cfg.mode == "EBPF" {
		for _, ns := range []*harness.NS{e.Pod, e.Remote} {
			if err := ie.NoNetfilter(ns); err != nil {
				b.Fatalf("%s, after the traffic: %v", cfg.name, err)
			}
		}
	}
	if cfg.fast {
		if after := fastpathBenchStatus(b, h).Counters; after.RedirectedMessages <= before.RedirectedMessages {
			b.Fatalf("%s: the fast path redirected nothing (%+v)", cfg.name, after)
		}
	}
}

// captureBenchConnect makes captureBenchConns connections from ns to dst,
// captureBenchWorkers at a time, each one 64 B request and its reply, and
// returns connections per second.
func captureBenchConnect(b *testing.B, ns *harness.NS, dst netip.AddrPort) float64 {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	msg := string(fastpathBenchMsg(64)[:63])
	per := captureBenchConns / captureBenchWorkers
	start := time.Now()
	for range captureBenchWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				if _, err := ie.Request(ns, dst, msg); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	if len(errs) > 0 {
		b.Fatalf("connections to %s: %d failed, first: %v", dst, len(errs), errs[0])
	}
	return float64(per*captureBenchWorkers) / d.Seconds()
}

// captureBenchRoundTrips times 64 B round trips on one connection from ns
// to dst: the round's median and CPU time per request.
func captureBenchRoundTrips(b *testing.B, pr pathRun, ns *harness.NS, dst netip.AddrPort, rtt, cpu *rounds) {
	c, err := ie.Dial(ns, dst)
	if err != nil {
		b.Fatalf("dial %s: %v", dst, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	d, perReq, err := timedPingPong(b, pr, c, bufio.NewReaderSize(c, 4<<10), fastpathBenchMsg(64), captureBenchWarmup, captureBenchRounds)
	if err != nil {
		b.Fatalf("round trips to %s: %v", dst, err)
	}
	*rtt, *cpu = append(*rtt, d), append(*cpu, perReq)
}

// captureBenchAdds times the chained intercept plugin's ADD through libcni
// for an Istio pod in REDIRECT and in EBPF mode (the programs attached),
// alternating, each ADD followed by its DEL in the same namespace.
func captureBenchAdds(b *testing.B, h *harness.H) map[string]harness.Samples {
	if _, err := capture.Attach("", ""); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if _, err := capture.Detach("", false); err != nil {
			b.Error(err)
		}
	}()
	ns := h.NewNS("mwcb-add")
	adds := map[string]harness.Samples{}
	modes := []string{"REDIRECT", "EBPF"}
	waitSettled(b, "ADD timing")
	for i := 0; i < captureBenchAddN*b.N; i++ {
		for k := range modes {
			mode := modes[(k+i)%len(modes)]
			a := ie.ChainedIntercept(h, "mwcb-add", ns, map[string]string{
				"sidecar.istio.io/status":    `{"containers":["istio-proxy"]}`,
				"intercept.meshwire.io/mode": mode,
			})
			s := adds[mode]
			if err := s.Time(func() error { _, err := a.Add(); return err }); err != nil {
				b.Fatalf("ADD in %s mode: %v", mode, err)
			}
			adds[mode] = s
			if err := a.Del(); err != nil {
				b.Fatalf("DEL in %s mode: %v", mode, err)
			}
		}
	}
	return adds
}

func captureBenchReport(b *testing.B, res map[string][]*captureBenchResult, pls []placement, meter *cpuMeter, adds map[string]harness.Samples, nRounds int) {
	for _, pl := range pls {
		rs := res[pl.name]
		redir := rs[captureBenchRedirect]
		tab := &harness.Table{
			Title: fmt.Sprintf("EBPF interception, %s: per proxied connection, IPv4 (%d rounds; conntrack and rate: mean over rounds of %d connections, %d at once; round trips: 64 B on one connection, median of the rounds' medians of %d [min–max], µs). %s",
				pl.name, nRounds, captureBenchConns, captureBenchWorkers, captureBenchRounds, meter.method()),
			Header: []string{"configuration", "conntrack entries per connection", "connections/s", "vs REDIRECT", "hop round trip µs", "vs REDIRECT", "hop CPU µs/request", "vs REDIRECT",
				"sidecar to sidecar µs", "vs REDIRECT", "vs none", "sidecar to sidecar CPU µs/request", "vs REDIRECT"},
		}
		for i, cfg := range captureBenchConfigs {
			r := rs[i]
			tab.Add(cfg.name, fmt.Sprintf("%.2f", fastpathBenchMean(r.conntrack)),
				fmt.Sprintf("%.0f", fastpathBenchMean(r.rate)), fmt.Sprintf("%.2fx", fastpathBenchMean(r.rate)/fastpathBenchMean(redir.rate)),
				spreadCell(r.hop), harness.Ratio(r.hop.Median(), redir.hop.Median()),
				spreadCell(r.hopCPU), harness.Ratio(r.hopCPU.Median(), redir.hopCPU.Median()),
				spreadCell(r.s2s), harness.Ratio(r.s2s.Median(), redir.s2s.Median()), harness.Ratio(r.s2s.Median(), rs[captureBenchNone].s2s.Median()),
				spreadCell(r.s2sCPU), harness.Ratio(r.s2sCPU.Median(), redir.s2sCPU.Median()))
		}
		tab.Write(os.Stdout)
	}

	ad := &harness.Table{
		Title:  fmt.Sprintf("EBPF interception: chained intercept ADD through libcni, an Istio pod (median / p95 of %d, ms)", len(adds["EBPF"])),
		Header: []string{"mode", "ADD", "vs REDIRECT"},
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }
	for _, mode := range []string{"REDIRECT", "EBPF"} {
		ad.Add(mode, ms(adds[mode].Median())+" / "+ms(adds[mode].P95()), harness.Ratio(adds[mode].Median(), adds["REDIRECT"].Median()))
	}
	ad.Write(os.Stdout)

	idx := func(name string) int {
		for i, c := range captureBenchConfigs {
			if c.name == name {
				return i
			}
		}
		panic(name)
	}
	for _, pl := range pls {
		er := newEveryRound("EBPF interception, "+pl.name, nRounds)
		for i, cfg := range captureBenchConfigs {
			r := res[pl.name][i]
			er.add(cfg.name, "conntrack entries per connection", r.conntrack, func(v float64) string { return fmt.Sprintf("%.2f", v) })
			er.add(cfg.name, "connections/s", r.rate, noDecimal)
			er.add(cfg.name, "hop 64 B µs", microseconds(r.hop), oneDecimal)
			er.add(cfg.name, "hop 64 B CPU µs/request", microseconds(r.hopCPU), oneDecimal)
			er.add(cfg.name, "sidecar to sidecar 64 B µs", microseconds(r.s2s), oneDecimal)
			er.add(cfg.name, "sidecar to sidecar CPU µs/request", microseconds(r.s2sCPU), oneDecimal)
		}
		er.write()
	}

	ebpf, fastIdx := idx("EBPF"), []int{idx("REDIRECT + fast path"), idx("EBPF + fast path")}
	redirOf := func(pl string) *captureBenchResult { return res[pl][captureBenchRedirect] }
	noneOf := func(pl string) *captureBenchResult { return res[pl][captureBenchNone] }
	tg := newTargets("EBPF interception: targets (with the fast path: the Istio pod's policy, as the chained intercept plugin writes it)", pls, nRounds)
	tg.judge("conntrack entries per connection: 0", "EBPF", limit{value: 0, atMost: true, plain: true}, func(pl string) figure {
		e, r := res[pl][ebpf].conntrack, redirOf(pl).conntrack
		return figure{paired: e, medians: fmt.Sprintf("%.2f (REDIRECT %.2f)", fastpathBenchMean(e), fastpathBenchMean(r))}
	})
	// The ADDs alternate between the modes: each EBPF ADD is paired with
	// the REDIRECT ADD beside it.
	ea, ra := adds["EBPF"].Median(), adds["REDIRECT"].Median()
	tg.once("ADD no slower than REDIRECT's", "EBPF", atMost(1), figure{
		paired:  pairedRatios(microseconds(adds["EBPF"]), microseconds(adds["REDIRECT"])),
		medians: fmt.Sprintf("%s (%s vs %s ms)", harness.Ratio(ea, ra), ms(ea), ms(ra)),
		groups:  roundGroups(microseconds(adds["EBPF"]), "REDIRECT", microseconds(adds["REDIRECT"]), "µs", noDecimal, false),
	})
	tg.judge("connection rate at least REDIRECT's", "EBPF", atLeast(1), func(pl string) figure {
		e, r := res[pl][ebpf].rate, redirOf(pl).rate
		return figure{
			paired:  pairedRatios(e, r),
			medians: fmt.Sprintf("%.2fx (%.0f vs %.0f /s)", fastpathBenchMean(e)/fastpathBenchMean(r), fastpathBenchMean(e), fastpathBenchMean(r)),
			groups:  roundGroups(e, "REDIRECT", r, "/s", noDecimal, true),
		}
	})
	// ratio is a latency or CPU figure against REDIRECT alone's, round by
	// round.
	ratio := func(x, base rounds, medians string) figure {
		return figure{paired: pairedRatios(microseconds(x), microseconds(base)), medians: medians, groups: roundGroups(microseconds(x), "REDIRECT", microseconds(base), "µs", oneDecimal, false)}
	}
	fast := idx("EBPF + fast path")
	tg.judge("hop 64 B round trip <= 0.5x REDIRECT alone", captureBenchConfigs[fast].name, atMost(0.5), func(pl string) figure {
		x, redir := res[pl][fast].hop, redirOf(pl).hop
		d, r := x.Median(), redir.Median()
		return ratio(x, redir, fmt.Sprintf("%s (%s vs %s µs; %s)", harness.Ratio(d, r), fastpathBenchUs(d), fastpathBenchUs(r), unixRefFigure(noneOf(pl).unixHop.Median(), r)))
	})
	tg.judge("CPU time per request, hop 64 B <= 0.6x REDIRECT alone", captureBenchConfigs[fast].name, atMost(0.6), func(pl string) figure {
		x, redir := res[pl][fast].hopCPU, redirOf(pl).hopCPU
		text, _ := cpuFigure(x.Median(), redir.Median(), 0.6)
		return ratio(x, redir, text)
	})
	for _, i := range fastIdx {
		tg.judge("sidecar to sidecar 64 B round trip >= 35% of the way from REDIRECT to no mesh", captureBenchConfigs[i].name, shareAtLeast(0.35), func(pl string) figure {
			x, redir, none := res[pl][i].s2s, redirOf(pl).s2s, noneOf(pl).s2s
			text, _ := gapFigure(x.Median(), redir.Median(), none.Median(), 0.35)
			unixClosed, _ := gapClosed(noneOf(pl).unixS2S.Median(), redir.Median(), none.Median())
			return figure{
				paired:  pairedGaps(microseconds(x), microseconds(redir), microseconds(none)),
				medians: fmt.Sprintf("%s; the same four processes over Unix sockets %s µs, %.0f%% of the way", text, fastpathBenchUs(noneOf(pl).unixS2S.Median()), 100*unixClosed),
				groups:  roundGroups(microseconds(x), "REDIRECT", microseconds(redir), "µs", oneDecimal, false),
			}
		})
		tg.judge("CPU time per request, sidecar to sidecar 64 B <= 0.8x REDIRECT", captureBenchConfigs[i].name, atMost(0.8), func(pl string) figure {
			x, redir := res[pl][i].s2sCPU, redirOf(pl).s2sCPU
			text, _ := cpuFigure(x.Median(), redir.Median(), 0.8)
			return ratio(x, redir, text)
		})
	}
	tg.write()

	if os.Getenv("MESHWIRE_BENCH_PLOT") != "1" {
		return
	}
	root, err := harness.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	panels := []fastpathBenchPanel{
		{title: "conntrack entries per connection", unit: "entries"},
		{title: "connections per second", unit: "1/s"},
		{title: "app <-> sidecar hop, 64 B", unit: "µs"},
		{title: "sidecar to sidecar, 64 B", unit: "µs"},
	}
	var legend []string
	for i, cfg := range captureBenchConfigs {
		r := res[pls[0].name][i]
		legend = append(legend, cfg.name)
		for p, v := range []float64{fastpathBenchMean(r.conntrack), fastpathBenchMean(r.rate), float64(r.hop.Median()) / 1e3, float64(r.s2s.Median()) / 1e3} {
			panels[p].values = append(panels[p].values, v)
		}
	}
	out := filepath.Join(root, "docs", "capture-bench.svg")
	title := fmt.Sprintf("meshwire EBPF interception, IPv4, %s (%d rounds per bar; round trips: median of the rounds' medians)", pls[0].name, nRounds)
	if err := os.WriteFile(out, []byte(fastpathBenchSVG(title, panels, 2, legend, captureBenchColors)), 0o644); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("\nplot: %s\n", out)
}
