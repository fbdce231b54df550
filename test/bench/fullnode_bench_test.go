//go:build kernel

package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/meshwire/meshwire/internal/installer"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/test/cri"
	"github.com/meshwire/meshwire/test/harness"
)

// The full-node benchmark: fnPods pods through containerd's CRI, created
// and removed fnBatch at a time, each with one host port, bandwidth limits
// and Istio's injection annotations, on a bridge network with portmap,
// bandwidth and intercept chained as `meshwire install --chain` writes
// them.
const (
	fnNetwork  = "mwt-fullnode"
	fnPods     = 250
	fnBatch    = 25
	fnSubnet   = "198.19.0.0/23"
	fnGateway  = "198.19.0.1"
	fnHostPort = 41000 // pod i maps fnHostPort+i
	fnInbound  = 15006 // the sidecar's inbound port: intercept redirects port 80 there
)

// fnProbes is how many probe pods run one at a time, each added and
// removed before the next, on the empty node and on the full one.
const fnProbes = 5

// fnRun is what one implementation's run measured: per pod, in creation
// order, how long RunPodSandbox and its removal took as the runtime's
// client sees them, and (meshwire only) the plugin chain's own time and
// CPU time from the plugins' log; the same for the probe pods, on the
// empty node and with every pod on it.
type fnRun struct {
	add, del                 []time.Duration
	chainAdd, chainDel       map[string]time.Duration // by "plugin sandbox-id", plugin "" for the whole chain
	chainAddCPU, chainDelCPU map[string]time.Duration // the same for CPU time (user + system)
	ids                      []string
	reachable, reachErrs     int
	probes                   [2]fnProbeRun // on the empty node, on the full node
}

// fnProbeRun is one set of probe pods: the CRI calls' times and the pods'
// sandbox ids.
type fnProbeRun struct {
	add, del []time.Duration
	ids      []string
}

// BenchmarkFullNode fills a node with 250 pods through containerd's CRI
// and empties it, with meshwire's plugins and with the reference v1.9.1
// (bridge, host-local, portmap and bandwidth; intercept is meshwire's in
// both, the reference has none), in alternating order. It fails when a pod
// is unreachable through its host port or anything is left behind, and
// when meshwire's plugin chain costs a pod of the last batch more than
// fnBound times the CPU time of one of the first (ADD; DEL with 250 pods
// against with 25). It reports the CRI calls' and the chain's wall-clock
// medians of the first and the last batch beside that, and fnProbes
// probe pods run one at a time on the empty and on the full node.
func BenchmarkFullNode(b *testing.B) {
	ref := peers(b)[0]
	h := harness.New(b)
	nodeForwarding(b)
	mw := impl{name: "meshwire", tag: "mw", dir: h.BinDir, meshwire: true}
	// The reference's plugins and meshwire's intercept.
	refDir := binDirWith(b, ref.dir, map[string]string{"intercept": filepath.Join(h.BinDir, "intercept")})
	ref.dir = refDir
	runs := map[string][]*fnRun{}
	for n := 0; n < b.N; n++ {
		order := []impl{mw, ref}
		if n%2 == 1 {
			order = []impl{ref, mw}
		}
		for _, im := range order {
			harness.WaitIdle(10 * time.Second)
			b.Run(im.tag, func(b *testing.B) {
				runs[im.name] = append(runs[im.name], fnFill(b, h, im))
			})
		}
	}
	fnReport(b, runs[mw.name], runs[ref.name], ref.name)
}

// nodeForwarding turns on IPv4 forwarding, as a node has it.
func nodeForwarding(b *testing.B) {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		b.Fatal(err)
	}
}

// fnFill runs one implementation: fill the node, reach every pod, empty
// it, check nothing is left.
func fnFill(b *testing.B, h *harness.H, im impl) *fnRun {
	// A harness of this sub-benchmark: its leak check runs when the
	// sub-benchmark's cleanups do (after containerd's, which removes
	// whatever pod is left).
	if im.meshwire {
		sh := &harness.H{T: b, BinDir: h.BinDir, CacheDir: b.TempDir()}
		sh.CheckNoLeaks()
	} else {
		// The reference portmap never removes its shared chains (and,
		// with 25 ADDs at once, may add their jumps more than once):
		// taken away after its run so that they are not the next run's.
		b.Cleanup(func() { pmBenchRemoveReferenceBase(b) })
	}
	br := "mwfn" + im.tag
	b.Cleanup(func() {
		if l, err := netlink.LinkByName(br); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	dataDir := b.TempDir()
	chained, err := installer.Chain([]byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"plugins":[
		{"type":"bridge","bridge":%q,"isDefaultGateway":true,
		 "ipam":{"type":"host-local","ranges":[[{"subnet":%q,"gateway":%q}]],"dataDir":%q}}]}`, fnNetwork, br, fnSubnet, fnGateway, dataDir)))
	if err != nil {
		b.Fatal(err)
	}
	c := cri.Start(b, cri.Config{BinDir: im.dir, ConfList: string(chained.Out)})
	run := &fnRun{add: make([]time.Duration, fnPods), del: make([]time.Duration, fnPods), ids: make([]string, fnPods)}
	pods := make([]*cri.Pod, fnPods)
	run.probes[0] = fnProbe(b, c, "empty")
	var failed []error
	var mu sync.Mutex
	batches := func(op func(i int) error) {
		for first := 0; first < fnPods; first += fnBatch {
			var wg sync.WaitGroup
			for i := first; i < first+fnBatch && i < fnPods; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					if err := op(i); err != nil {
						mu.Lock()
						failed = append(failed, err)
						mu.Unlock()
					}
				}(i)
			}
			wg.Wait()
		}
	}
	batches(func(i int) error {
		spec := fnSpec(fmt.Sprintf("p%03d", i), fnHostPort+i)
		start := time.Now()
		p, err := c.RunPodE(spec)
		run.add[i] = time.Since(start)
		if err != nil {
			return fmt.Errorf("pod %d: RunPodSandbox: %v", i, err)
		}
		pods[i], run.ids[i] = p, p.ID
		return nil
	})
	if len(failed) > 0 {
		b.Fatalf("%s: %d pods failed, first: %v", im.name, len(failed), failed[0])
	}
	run.reachable, run.reachErrs = fnReach(b, pods)
	run.probes[1] = fnProbe(b, c, "full")
	batches(func(i int) error {
		start := time.Now()
		err := pods[i].Remove()
		run.del[i] = time.Since(start)
		if err != nil {
			return fmt.Errorf("pod %d: remove: %v", i, err)
		}
		return nil
	})
	if len(failed) > 0 {
		b.Fatalf("%s: %d removals failed, first: %v", im.name, len(failed), failed[0])
	}
	if n := harness.Reservations(b, dataDir, fnNetwork); n != 0 {
		b.Errorf("%s: %d addresses still reserved after every pod was removed", im.name, n)
	}
	if run.reachErrs > 0 {
		b.Errorf("%s: %d of %d pods unreachable through their host port", im.name, run.reachErrs, fnPods)
	}
	if im.meshwire {
		run.chainAdd, run.chainDel, run.chainAddCPU, run.chainDelCPU = fnChainTimes(b, c.PluginLogPath())
		// MESHWIRE_BENCH_KEEP_LOG names a folder that keeps the plugins'
		// log (debug level: every step), which the temporary directory
		// does not.
		if dir := os.Getenv("MESHWIRE_BENCH_KEEP_LOG"); dir != "" {
			if data, err := os.ReadFile(c.PluginLogPath()); err == nil {
				name := filepath.Join(dir, fmt.Sprintf("fullnode-plugins-%d.log", time.Now().Unix()))
				if err := os.WriteFile(name, data, 0o644); err == nil {
					b.Logf("plugins' log kept in %s", name)
				}
			}
		}
	}
	return run
}

// fnProbe runs fnProbes pods one at a time, each created and removed
// before the next, with the same network and annotations as the others
// (host ports past theirs): what one pod costs on the node as it is, with
// no other pod being created beside it.
func fnProbe(b *testing.B, c *cri.Containerd, when string) fnProbeRun {
	harness.WaitIdle(10 * time.Second)
	pr := fnProbeRun{}
	for k := 0; k < fnProbes; k++ {
		spec := fnSpec(fmt.Sprintf("probe-%s-%d", when, k), fnHostPort+fnPods+k)
		start := time.Now()
		p, err := c.RunPodE(spec)
		pr.add = append(pr.add, time.Since(start))
		if err != nil {
			b.Fatalf("probe pod %d on the %s node: RunPodSandbox: %v", k, when, err)
		}
		pr.ids = append(pr.ids, p.ID)
		start = time.Now()
		err = p.Remove()
		pr.del = append(pr.del, time.Since(start))
		if err != nil {
			b.Fatalf("probe pod %d on the %s node: remove: %v", k, when, err)
		}
	}
	return pr
}

// fnSpec is the pod: one host port, bandwidth limits both ways, Istio's
// injection annotations.
func fnSpec(name string, hostPort int) cri.PodSpec {
	return cri.PodSpec{Name: name, Namespace: "fullnode",
		PortMappings: []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 80, HostPort: int32(hostPort)}},
		Annotations: map[string]string{
			"kubernetes.io/ingress-bandwidth": "100M",
			"kubernetes.io/egress-bandwidth":  "100M",
			"sidecar.istio.io/status":         `{"initContainers":["istio-validation"],"containers":["istio-proxy"]}`,
		}}
}

// fnReach serves on every pod's inbound sidecar port (from the host, in the
// pod's namespace) and connects to each pod's host port on the node's
// gateway address: portmap's DNAT, then intercept's redirect of port 80,
// must take the connection to that pod. It returns how many answered with
// their own name and how many did not.
func fnReach(b *testing.B, pods []*cri.Pod) (ok, bad int) {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for i, p := range pods {
		var l net.Listener
		err := netns.Enter(p.NetNS(), func() (err error) {
			l, err = net.Listen("tcp4", fmt.Sprintf(":%d", fnInbound))
			return err
		})
		if err != nil {
			b.Fatalf("pod %d: listen in its namespace: %v", i, err)
		}
		listeners = append(listeners, l)
		go func(name string) {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(conn, name)
				conn.Close()
			}
		}(fmt.Sprintf("p%03d", i))
	}
	for i := range pods {
		want := fmt.Sprintf("p%03d", i)
		got, err := fnGet(net.JoinHostPort(fnGateway, fmt.Sprint(fnHostPort+i)))
		if err != nil || got != want {
			bad++
			if bad <= 3 {
				b.Logf("pod %d through host port %d: %q, %v", i, fnHostPort+i, got, err)
			}
			continue
		}
		ok++
	}
	return ok, bad
}

func fnGet(addr string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	return line[:max(len(line)-1, 0)], nil
}

// fnChainTimes reads the durations and CPU times meshwire's plugins logged
// for ADD and for DEL, per plugin and sandbox ("bridge <id>"), and summed
// over the chain (" <id>").
func fnChainTimes(b *testing.B, logPath string) (add, del, addCPU, delCPU map[string]time.Duration) {
	f, err := os.Open(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	add, del = map[string]time.Duration{}, map[string]time.Duration{}
	addCPU, delCPU = map[string]time.Duration{}, map[string]time.Duration{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			Msg         string  `json:"msg"`
			Plugin      string  `json:"plugin"`
			Command     string  `json:"command"`
			ContainerID string  `json:"containerID"`
			DurationMs  float64 `json:"durationMs"`
			CPUMs       float64 `json:"cpuMs"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Msg != "done" {
			continue
		}
		ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
		for _, x := range []struct {
			m map[string]time.Duration
			d time.Duration
		}{
			{map[string]map[string]time.Duration{"ADD": add, "DEL": del}[e.Command], ms(e.DurationMs)},
			{map[string]map[string]time.Duration{"ADD": addCPU, "DEL": delCPU}[e.Command], ms(e.CPUMs)},
		} {
			if x.m != nil {
				x.m[" "+e.ContainerID] += x.d
				x.m[e.Plugin+" "+e.ContainerID] += x.d
			}
		}
	}
	return add, del, addCPU, delCPU
}

// fnBound is how much more, at most, meshwire's plugin chain may cost a
// pod on a full node than on an empty one: the median CPU time (user +
// system, the plugins' cpuMs, their children's included) of the chain's
// ADD for the last batch of 25 against the first, and of its DEL with 250
// pods on the node against with 25 (a pod's DEL is both of containerd's:
// it runs one at StopPodSandbox and another at RemovePodSandbox).
//
// Why CPU time and not the wall-clock medians the table also prints: 25
// ADDs at once, each containerd's work plus a chain of five plugin
// processes, keep both CPUs of these machines busy, and a plugin's wall
// time there is mostly waiting for a CPU and for the rtnl lock, which
// the kernel's work for the other 24 pods holds (IPv6 autoconfiguration
// of each new interface, the bridge flooding each pod's multicast and
// gratuitous ARP to every port). Which plugin shows that waiting, and how
// much, depends on where the scheduler puts 25 processes: the same build's
// batch medians moved by 2x between runs (chain ADD 1.63x-2.94x, bridge's
// own 1.85x-6.04x in three runs). CPU time counts the work a pod's chain
// does, so work that grows with the pods on the node (a dump that walks
// every device, a table copied whole) shows in it, and waiting does not
// (a lock's optimistic spinning is the exception). The probe pods, one at
// a time on the empty and on the full node, are printed beside it: their
// wall time is a latency without contention, but five samples of it
// still move with whatever the kernel is finishing for the other pods.
const fnBound = 1.5

// fnBatchMedian is the median of samples [first, first+fnBatch).
func fnBatchMedian(s []time.Duration, first int) time.Duration {
	return harness.Samples(s[first : first+fnBatch]).Median()
}

// fnPlugins are the rows per plugin: "" is the whole chain.
var fnPlugins = []string{"", "bridge", "portmap", "bandwidth", "intercept"}

// fnOf is m's value for each of ids, for plugin.
func fnOf(m map[string]time.Duration, plugin string, ids []string) []time.Duration {
	out := make([]time.Duration, len(ids))
	for j, id := range ids {
		out[j] = m[plugin+" "+id]
	}
	return out
}

func fnReport(b *testing.B, mw, ref []*fnRun, refName string) {
	last := fnPods - fnBatch
	t := &harness.Table{
		Title: fmt.Sprintf("%d pods through containerd's CRI, %d at a time (bridge, host-local, portmap, bandwidth, intercept): medians of the first and the last batch of %d, ms; wall-clock time unless the row says CPU (user + system); the bound (%.1fx) is on meshwire's plugin chain CPU",
			fnPods, fnBatch, fnBatch, fnBound),
		Header: []string{"run", "implementation", "reachable", "ADD pods 1-25", "ADD pods 226-250", "ratio", "DEL with 250 pods", "DEL with 25 pods", "ratio"},
	}
	pt := &harness.Table{
		Title: fmt.Sprintf("%d probe pods one at a time (each added and removed before the next), on the empty node and with %d pods: medians, ms",
			fnProbes, fnPods),
		Header: []string{"run", "implementation", "ADD empty node", fmt.Sprintf("ADD with %d pods", fnPods), "ratio", fmt.Sprintf("DEL with %d pods", fnPods), "DEL empty node", "ratio"},
	}
	med := func(s []time.Duration) time.Duration { return harness.Samples(s).Median() }
	row := func(i int, name string, r *fnRun) {
		a1, a2 := fnBatchMedian(r.add, 0), fnBatchMedian(r.add, last)
		d1, d2 := fnBatchMedian(r.del, 0), fnBatchMedian(r.del, last)
		t.Add(fmt.Sprint(i+1), name+" (CRI call)", fmt.Sprintf("%d/%d", r.reachable, fnPods),
			harness.Ms(a1), harness.Ms(a2), harness.Ratio(a2, a1), harness.Ms(d1), harness.Ms(d2), harness.Ratio(d1, d2))
		pe, pf := r.probes[0], r.probes[1]
		pt.Add(fmt.Sprint(i+1), name+" (CRI call)", harness.Ms(med(pe.add)), harness.Ms(med(pf.add)), harness.Ratio(med(pf.add), med(pe.add)),
			harness.Ms(med(pf.del)), harness.Ms(med(pe.del)), harness.Ratio(med(pf.del), med(pe.del)))
		if r.chainAdd == nil {
			return
		}
		for _, plugin := range fnPlugins {
			what := "plugin chain"
			if plugin != "" {
				what = plugin
			}
			for _, cpu := range []bool{false, true} {
				ma, md, label := r.chainAdd, r.chainDel, what
				if cpu {
					ma, md, label = r.chainAddCPU, r.chainDelCPU, what+", CPU"
				}
				ca, cd := fnOf(ma, plugin, r.ids), fnOf(md, plugin, r.ids)
				c1, c2 := fnBatchMedian(ca, 0), fnBatchMedian(ca, last)
				e1, e2 := fnBatchMedian(cd, 0), fnBatchMedian(cd, last)
				t.Add(fmt.Sprint(i+1), name+" ("+label+")", "",
					harness.Ms(c1), harness.Ms(c2), harness.Ratio(c2, c1), harness.Ms(e1), harness.Ms(e2), harness.Ratio(e1, e2))
				if plugin == "" || cpu {
					qa, qd := med(fnOf(ma, plugin, pf.ids)), med(fnOf(md, plugin, pf.ids))
					pa, pd := med(fnOf(ma, plugin, pe.ids)), med(fnOf(md, plugin, pe.ids))
					pt.Add(fmt.Sprint(i+1), name+" ("+label+")", harness.Ms(pa), harness.Ms(qa), harness.Ratio(qa, pa),
						harness.Ms(qd), harness.Ms(pd), harness.Ratio(qd, pd))
				}
				// The bound meshwire holds (see fnBound): its own chain's
				// CPU time per pod, ADD and DEL, within 1.5x of the first
				// batch's (containerd's part of the CRI call is not
				// meshwire's to bound).
				if plugin == "" && cpu {
					if float64(c2) > fnBound*float64(c1) {
						b.Errorf("run %d: meshwire's chain ADD of pods 226-250 costs %s of CPU, %.2fx pods 1-25's %s (bound %.1fx)", i+1, c2, float64(c2)/float64(c1), c1, fnBound)
					}
					if float64(e1) > fnBound*float64(e2) {
						b.Errorf("run %d: meshwire's chain DEL with 250 pods costs %s of CPU, %.2fx that with 25 (%s) (bound %.1fx)", i+1, e1, float64(e1)/float64(e2), e2, fnBound)
					}
				}
			}
		}
	}
	for i := range mw {
		row(i, "meshwire", mw[i])
		if i < len(ref) {
			row(i, refName, ref[i])
		}
	}
	t.Write(os.Stdout)
	pt.Write(os.Stdout)
}
