//go:build kernel

package bench

import (
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
// Every configuration runs captureBenchReps times, each in a fresh pod and
// remote, the order reversed every other repetition, each run starting on a
// settled machine. A run in EBPF mode fails unless the pod's namespace has
// no conntrack entry, nftables rule or iptables table after its traffic; a
// run with the fast path fails unless it redirected messages.
//
// Targets (PASS/FAIL printed): EBPF mode leaves 0 conntrack entries per
// connection; its ADD is no slower than REDIRECT's (median); its
// connection rate is at least REDIRECT's; with the fast path, the hop's
// 64 B round trip is at most 0.5x REDIRECT alone's, and the sidecar to
// sidecar round trip at least 30% of the way from REDIRECT to no
// interception.
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
	res := make([]*captureBenchResult, len(captureBenchConfigs))
	for i := range res {
		res[i] = &captureBenchResult{}
	}
	reps := captureBenchReps * b.N
	start := time.Now()
	for rep := 0; rep < reps; rep++ {
		for k := range captureBenchConfigs {
			i := k
			if rep%2 == 1 {
				i = len(captureBenchConfigs) - 1 - k
			}
			captureBenchRun(b, h, captureBenchConfigs[i], res[i])
		}
	}
	adds := captureBenchAdds(b, h)
	b.Logf("BenchmarkCapture: %d repetitions of %d configurations and %d ADDs per mode in %s", reps, len(captureBenchConfigs), captureBenchAddN*b.N, time.Since(start).Round(time.Second))
	captureBenchReport(b, res, adds, reps)
}

const (
	captureBenchReps    = 4    // runs per configuration (pooled), alternating the order
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
	conntrack []float64 // entries per connection, one per run
	rate      []float64 // connections per second, one per run
	hop, s2s  harness.Samples
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
func captureBenchRun(b *testing.B, h *harness.H, cfg captureBenchConfig, res *captureBenchResult) {
	e := ie.New(b, h)
	startRemoteEcho(e)
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
	waitSettled(b, cfg.name+", hop")
	captureBenchRoundTrips(b, e.Pod, hopDst, &res.hop)
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
		defer captureBenchProxy(e, e.Remote, cfg).Stop()
	}
	waitSettled(b, cfg.name+", sidecar to sidecar")
	peers := fastpathBenchStatus(b, h).PeerPairs
	captureBenchRoundTrips(b, e.Pod, ie.AP(ie.RemoteV4, ie.EchoPort), &res.s2s)
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
// to dst.
func captureBenchRoundTrips(b *testing.B, ns *harness.NS, dst netip.AddrPort, s *harness.Samples) {
	c, err := ie.Dial(ns, dst)
	if err != nil {
		b.Fatalf("dial %s: %v", dst, err)
	}
	pingPong64(b, c, dst.String(), captureBenchWarmup, captureBenchRounds, s)
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

func captureBenchReport(b *testing.B, res []*captureBenchResult, adds map[string]harness.Samples, reps int) {
	mean := fastpathBenchMean
	none, redir := res[captureBenchNone], res[captureBenchRedirect]
	tab := &harness.Table{
		Title: fmt.Sprintf("EBPF interception: per proxied connection, IPv4 (%d runs per row; conntrack and rate over %d connections per run, %d at once; round trips: median / p95 of %d, 64 B on one connection)",
			reps, captureBenchConns, captureBenchWorkers, captureBenchRounds*reps),
		Header: []string{"configuration", "conntrack entries per connection", "connections/s", "vs REDIRECT", "hop round trip µs", "vs REDIRECT", "sidecar to sidecar µs", "vs REDIRECT", "vs none"},
	}
	for i, cfg := range captureBenchConfigs {
		r := res[i]
		tab.Add(cfg.name, fmt.Sprintf("%.2f", mean(r.conntrack)),
			fmt.Sprintf("%.0f", mean(r.rate)), fmt.Sprintf("%.2fx", mean(r.rate)/mean(redir.rate)),
			fastpathBenchUs(r.hop.Median())+" / "+fastpathBenchUs(r.hop.P95()), harness.Ratio(r.hop.Median(), redir.hop.Median()),
			fastpathBenchUs(r.s2s.Median())+" / "+fastpathBenchUs(r.s2s.P95()), harness.Ratio(r.s2s.Median(), redir.s2s.Median()), harness.Ratio(r.s2s.Median(), none.s2s.Median()))
	}
	tab.Write(os.Stdout)

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
	ebpf, fast := res[idx("EBPF")], res[idx("EBPF + fast path")]
	tg := &harness.Table{Title: "EBPF interception: targets", Header: []string{"target", "figure", "result"}}
	tg.Add("conntrack entries per connection, EBPF: 0", fmt.Sprintf("%.2f (REDIRECT %.2f)", mean(ebpf.conntrack), mean(redir.conntrack)), verdict(mean(ebpf.conntrack) == 0))
	ea, ra := adds["EBPF"].Median(), adds["REDIRECT"].Median()
	tg.Add("ADD, EBPF no slower than REDIRECT", fmt.Sprintf("%s (%s vs %s ms)", harness.Ratio(ea, ra), ms(ea), ms(ra)), verdict(ea <= ra))
	tg.Add("connection rate, EBPF at least REDIRECT's", fmt.Sprintf("%.2fx (%.0f vs %.0f /s)", mean(ebpf.rate)/mean(redir.rate), mean(ebpf.rate), mean(redir.rate)), verdict(mean(ebpf.rate) >= mean(redir.rate)))
	hr := float64(fast.hop.Median()) / float64(redir.hop.Median())
	tg.Add("hop 64 B round trip, EBPF + fast path <= 0.5x REDIRECT",
		fmt.Sprintf("%.2fx (%s vs %s µs; %s)", hr, fastpathBenchUs(fast.hop.Median()), fastpathBenchUs(redir.hop.Median()), unixRefFigure(none.unixHop.Median(), redir.hop.Median())),
		verdict(hr <= 0.5))
	closed, _ := gapClosed(fast.s2s.Median(), redir.s2s.Median(), none.s2s.Median())
	unixClosed, _ := gapClosed(none.unixS2S.Median(), redir.s2s.Median(), none.s2s.Median())
	tg.Add("sidecar to sidecar, EBPF + fast path >= 30% of the way from REDIRECT to none",
		fmt.Sprintf("%.0f%% (%s µs; none %s, REDIRECT %s; the same four processes over Unix sockets %s µs, %.0f%% of the way)", 100*closed,
			fastpathBenchUs(fast.s2s.Median()), fastpathBenchUs(none.s2s.Median()), fastpathBenchUs(redir.s2s.Median()), fastpathBenchUs(none.unixS2S.Median()), 100*unixClosed),
		verdict(closed >= 0.3))
	tg.Write(os.Stdout)

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
		r := res[i]
		legend = append(legend, cfg.name)
		for p, v := range []float64{mean(r.conntrack), mean(r.rate), float64(r.hop.Median()) / 1e3, float64(r.s2s.Median()) / 1e3} {
			panels[p].values = append(panels[p].values, v)
		}
	}
	out := filepath.Join(root, "docs", "capture-bench.svg")
	title := fmt.Sprintf("meshwire EBPF interception, IPv4 (%d runs per bar; round trips: medians)", reps)
	if err := os.WriteFile(out, []byte(fastpathBenchSVG(title, panels, 2, legend, captureBenchColors)), 0o644); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("\nplot: %s\n", out)
}
