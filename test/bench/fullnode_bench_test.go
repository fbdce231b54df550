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

// fnRun is what one implementation's run measured: per pod, in creation
// order, how long RunPodSandbox and its removal took as the runtime's
// client sees them, and (meshwire only) the plugin chain's own time from
// the plugins' log.
type fnRun struct {
	add, del             []time.Duration
	chainAdd, chainDel   map[string]time.Duration // by "plugin sandbox-id", plugin "" for the whole chain
	ids                  []string
	reachable, reachErrs int
}

// BenchmarkFullNode fills a node with 250 pods through containerd's CRI
// and empties it, with meshwire's plugins and with the reference v1.9.1
// (bridge, host-local, portmap and bandwidth; intercept is meshwire's in
// both, the reference has none), in alternating order. It fails when a pod
// is unreachable through its host port or anything is left behind; it
// reports ADD and DEL latency of the first and the last batch.
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
		spec := cri.PodSpec{Name: fmt.Sprintf("p%03d", i), Namespace: "fullnode",
			PortMappings: []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 80, HostPort: int32(fnHostPort + i)}},
			Annotations: map[string]string{
				"kubernetes.io/ingress-bandwidth": "100M",
				"kubernetes.io/egress-bandwidth":  "100M",
				"sidecar.istio.io/status":         `{"initContainers":["istio-validation"],"containers":["istio-proxy"]}`,
			}}
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
		run.chainAdd, run.chainDel = fnChainTimes(b, c.PluginLogPath())
	}
	return run
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

// fnChainTimes reads the durations meshwire's plugins logged for ADD and
// for DEL, per plugin and sandbox ("bridge <id>"), and summed over the
// chain (" <id>").
func fnChainTimes(b *testing.B, logPath string) (add, del map[string]time.Duration) {
	f, err := os.Open(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	add, del = map[string]time.Duration{}, map[string]time.Duration{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			Msg         string  `json:"msg"`
			Plugin      string  `json:"plugin"`
			Command     string  `json:"command"`
			ContainerID string  `json:"containerID"`
			DurationMs  float64 `json:"durationMs"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Msg != "done" {
			continue
		}
		d := time.Duration(e.DurationMs * float64(time.Millisecond))
		m := map[string]map[string]time.Duration{"ADD": add, "DEL": del}[e.Command]
		if m != nil {
			m[" "+e.ContainerID] += d
			m[e.Plugin+" "+e.ContainerID] += d
		}
	}
	return add, del
}

// fnBound is how much slower, at most, meshwire's plugin chain may be on
// a full node than on an empty one (the last batch against the first).
const fnBound = 1.5

// fnBatchMedian is the median of samples [first, first+fnBatch).
func fnBatchMedian(s []time.Duration, first int) time.Duration {
	return harness.Samples(s[first : first+fnBatch]).Median()
}

func fnReport(b *testing.B, mw, ref []*fnRun, refName string) {
	last := fnPods - fnBatch
	t := &harness.Table{
		Title: fmt.Sprintf("%d pods through containerd's CRI, %d at a time (bridge, host-local, portmap, bandwidth, intercept): medians of the first and the last batch of %d, ms",
			fnPods, fnBatch, fnBatch),
		Header: []string{"run", "implementation", "reachable", "ADD pods 1-25", "ADD pods 226-250", "ratio", "DEL with 250 pods", "DEL with 25 pods", "ratio"},
	}
	row := func(i int, name string, r *fnRun) {
		a1, a2 := fnBatchMedian(r.add, 0), fnBatchMedian(r.add, last)
		d1, d2 := fnBatchMedian(r.del, 0), fnBatchMedian(r.del, last)
		t.Add(fmt.Sprint(i+1), name+" (CRI call)", fmt.Sprintf("%d/%d", r.reachable, fnPods),
			harness.Ms(a1), harness.Ms(a2), harness.Ratio(a2, a1), harness.Ms(d1), harness.Ms(d2), harness.Ratio(d1, d2))
		if r.chainAdd == nil {
			return
		}
		for _, plugin := range []string{"", "bridge", "portmap", "bandwidth", "intercept"} {
			times := func(m map[string]time.Duration) []time.Duration {
				out := make([]time.Duration, len(r.ids))
				for j, id := range r.ids {
					out[j] = m[plugin+" "+id]
				}
				return out
			}
			ca, cd := times(r.chainAdd), times(r.chainDel)
			c1, c2 := fnBatchMedian(ca, 0), fnBatchMedian(ca, last)
			e1, e2 := fnBatchMedian(cd, 0), fnBatchMedian(cd, last)
			what := "plugin chain"
			if plugin != "" {
				what = plugin
			}
			t.Add(fmt.Sprint(i+1), name+" ("+what+")", "",
				harness.Ms(c1), harness.Ms(c2), harness.Ratio(c2, c1), harness.Ms(e1), harness.Ms(e2), harness.Ratio(e1, e2))
			// The bound meshwire holds: its own chain's ADD and DEL of the
			// last batch within 1.5x of the first (containerd's part of
			// the CRI call is not meshwire's to bound).
			if plugin == "" && name == "meshwire" {
				if float64(c2) > fnBound*float64(c1) {
					b.Errorf("run %d: meshwire's chain ADD of pods 226-250 takes %s, %.2fx pods 1-25's %s (bound %.1fx)", i+1, c2, float64(c2)/float64(c1), c1, fnBound)
				}
				if float64(e1) > fnBound*float64(e2) {
					b.Errorf("run %d: meshwire's chain DEL with 250 pods takes %s, %.2fx that with 25 (%s) (bound %.1fx)", i+1, e1, float64(e1)/float64(e2), e2, fnBound)
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
}
