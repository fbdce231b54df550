package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
)

// BenchmarkBandwidth measures how accurately meshwire's bandwidth plugin
// shapes a pod's traffic, side by side with the reference plugin in the same
// run: iperf3 between the shaped pod and a second, unshaped pod (both on the
// reference ptp), ingress (to the pod) and egress (from the pod) at 10 Mbit/s,
// 100 Mbit/s and 1 Gbit/s, with the ratio achieved/configured; and the ping
// round trip through the shaped link, idle and while iperf3 fills it.
//
// Both plugins get the same config: rate R and a burst of R × 20 ms, and, to
// show what a runtime's large burst does to the queue, 10 Mbit/s with the
// burst containerd and CRI-O pass (2^32-1 bits). iperf3 runs
// bandwidthBenchSeconds seconds and omits the first one (slow start and the
// initial burst).
func BenchmarkBandwidth(b *testing.B) {
	h := harness.New(b)
	if _, err := exec.LookPath("iperf3"); err != nil {
		b.Fatal("iperf3 is missing: run test/deps.sh (make bench does)")
	}
	type scenario struct {
		label       string
		rate, burst uint64
	}
	var scenarios []scenario
	for _, r := range []uint64{10_000_000, 100_000_000, 1_000_000_000} {
		scenarios = append(scenarios, scenario{bandwidthBenchRate(r), r, r / 50})
	}
	scenarios = append(scenarios, scenario{"10 Mbit/s, burst 2^32-1", 10_000_000, 1<<32 - 1})
	impls := []string{"meshwire", "reference"}
	paths := map[string]string{}
	for _, impl := range impls {
		paths[impl] = bandwidthBenchPath(b, h, impl == "meshwire")
	}

	thr := &harness.Table{
		Title:  "bandwidth: achieved throughput (iperf3 TCP, Mbit/s, ratio achieved/configured)",
		Header: []string{"direction", "configured", "meshwire", "meshwire ratio", "reference", "reference ratio"},
	}
	lat := &harness.Table{
		Title:  "bandwidth: ping round trip through the shaped link (median of 20, ms)",
		Header: []string{"configured", "link", "meshwire", "reference", "unshaped"},
	}
	for i := 0; i < b.N; i++ {
		// Unshaped baseline.
		base := newBandwidthBenchPods(b, h, paths["meshwire"], "", 0, 0)
		baseIdle := bandwidthBenchPing(b, base, nil)
		base.close()
		type res struct {
			in, out         float64
			idle, inL, outL time.Duration
		}
		results := map[string]map[scenario]res{}
		for _, impl := range impls {
			results[impl] = map[scenario]res{}
			for _, sc := range scenarios {
				p := newBandwidthBenchPods(b, h, paths[impl], impl, sc.rate, sc.burst)
				var r res
				r.idle = bandwidthBenchPing(b, p, nil)
				r.in, r.inL = bandwidthBenchIperf(b, p.peer, p.pod, p.podIP, p)
				r.out, r.outL = bandwidthBenchIperf(b, p.pod, p.peer, p.peerIP, p)
				p.close()
				results[impl][sc] = r
			}
		}
		for _, dir := range []string{"ingress", "egress"} {
			for _, sc := range scenarios {
				cells := []string{dir, sc.label}
				for _, impl := range impls {
					got := results[impl][sc].in
					if dir == "egress" {
						got = results[impl][sc].out
					}
					cells = append(cells, fmt.Sprintf("%.1f", got/1e6), fmt.Sprintf("%.2f", got/float64(sc.rate)))
				}
				thr.Add(cells...)
			}
		}
		for _, sc := range scenarios {
			m, r := results["meshwire"][sc], results["reference"][sc]
			lat.Add(sc.label, "idle", harness.Ms(m.idle), harness.Ms(r.idle), harness.Ms(baseIdle))
			lat.Add(sc.label, "ingress full", harness.Ms(m.inL), harness.Ms(r.inL), "")
			lat.Add(sc.label, "egress full", harness.Ms(m.outL), harness.Ms(r.outL), "")
		}
	}
	thr.Write(os.Stdout)
	lat.Write(os.Stdout)
}

const bandwidthBenchSeconds = 5

func bandwidthBenchRate(r uint64) string {
	if r >= 1_000_000_000 {
		return fmt.Sprintf("%d Gbit/s", r/1_000_000_000)
	}
	return fmt.Sprintf("%d Mbit/s", r/1_000_000)
}

// bandwidthBenchPath makes a CNI path with the reference plugins and either
// meshwire's bandwidth or the reference one.
func bandwidthBenchPath(b *testing.B, h *harness.H, meshwire bool) string {
	dir := b.TempDir()
	entries, err := os.ReadDir(harness.ReferenceDir)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range entries {
		src := filepath.Join(harness.ReferenceDir, e.Name())
		if e.Name() == "bandwidth" && meshwire {
			src = filepath.Join(h.BinDir, "bandwidth")
		}
		if err := os.Symlink(src, filepath.Join(dir, e.Name())); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

type bandwidthBenchPods struct {
	b             *testing.B
	cni           *libcni.CNIConfig
	pod, peer     *harness.NS
	podIP, peerIP net.IP
	dels          []func()
}

// newBandwidthBenchPods attaches a pod shaped at rate with the given burst
// (both directions; no bandwidth plugin when rate is 0) and an unshaped peer
// to one ptp network.
func newBandwidthBenchPods(b *testing.B, h *harness.H, path, impl string, rate, burst uint64) *bandwidthBenchPods {
	p := &bandwidthBenchPods{b: b, cni: libcni.NewCNIConfigWithCacheDir([]string{path}, b.TempDir(), nil)}
	ipam := fmt.Sprintf(`{"type":"host-local","ranges":[[{"subnet":"198.18.46.0/24"}]],"dataDir":%q}`, b.TempDir())
	ptp := fmt.Sprintf(`{"type":"ptp","ipam":%s}`, ipam)
	shaped := ptp
	if rate > 0 {
		shaped += fmt.Sprintf(`,{"type":"bandwidth","ingressRate":%d,"ingressBurst":%d,"egressRate":%d,"egressBurst":%d}`, rate, burst, rate, burst)
	}
	name := "bw-bench-" + impl
	if impl == "" {
		name = "bw-bench"
	}
	attach := func(plugins string) (*harness.NS, net.IP) {
		list, err := libcni.ConfListFromBytes([]byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"plugins":[%s]}`, name, plugins)))
		if err != nil {
			b.Fatal(err)
		}
		ns := h.NewNS("bwb")
		rt := &libcni.RuntimeConf{ContainerID: harness.RandomID(), NetNS: ns.Path, IfName: "eth0"}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r, err := p.cni.AddNetworkList(ctx, list, rt)
		del := func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := p.cni.DelNetworkList(ctx, list, rt); err != nil {
				b.Errorf("DEL: %v", err)
			}
		}
		p.dels = append(p.dels, del)
		b.Cleanup(del)
		if err != nil {
			b.Fatalf("ADD %s: %v", name, err)
		}
		cr, err := current.NewResultFromResult(r)
		if err != nil || len(cr.IPs) == 0 {
			b.Fatalf("ADD result %v: %v", r, err)
		}
		return ns, cr.IPs[0].Address.IP
	}
	p.pod, p.podIP = attach(shaped)
	p.peer, p.peerIP = attach(ptp)
	return p
}

func (p *bandwidthBenchPods) close() {
	for _, d := range p.dels {
		d()
	}
	p.dels = nil
}

// bandwidthBenchPing returns the median of 20 pings from the peer to the
// pod, one every 100 ms, stopping early when stop is closed.
func bandwidthBenchPing(b *testing.B, p *bandwidthBenchPods, stop <-chan struct{}) time.Duration {
	var s harness.Samples
	for i := 0; i < 20; i++ {
		select {
		case <-stop:
			i = 20
			continue
		default:
		}
		rtt, err := probe.Ping(p.peer.Path, p.podIP, 3*time.Second)
		if err != nil {
			rtt = 3 * time.Second // lost: count as the timeout
		}
		s = append(s, rtt)
		time.Sleep(100 * time.Millisecond)
	}
	return s.Median()
}

// bandwidthBenchIperf runs iperf3 from one namespace to a server in the other
// and returns the received rate in bit/s and the median ping round trip
// measured while the transfer runs.
func bandwidthBenchIperf(b *testing.B, from, to *harness.NS, toIP net.IP, p *bandwidthBenchPods) (float64, time.Duration) {
	srv := exec.Command("ip", "netns", "exec", to.Name, "iperf3", "-s", "-1", "-B", toIP.String(), "-p", "5301")
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	var out []byte
	var err error
	for try := 0; try < 50; try++ { // until the server listens
		time.Sleep(100 * time.Millisecond)
		cli := exec.Command("ip", "netns", "exec", from.Name, "iperf3", "-c", toIP.String(), "-p", "5301",
			"-t", fmt.Sprint(bandwidthBenchSeconds), "-O", "1", "-J")
		done := make(chan time.Duration, 1)
		stop := make(chan struct{})
		go func() {
			time.Sleep(1500 * time.Millisecond)
			done <- bandwidthBenchPing(b, p, stop)
		}()
		out, err = cli.Output()
		close(stop)
		rtt := <-done
		if err == nil {
			var r struct {
				End struct {
					SumReceived struct {
						BitsPerSecond float64 `json:"bits_per_second"`
					} `json:"sum_received"`
				} `json:"end"`
			}
			if err := json.Unmarshal(out, &r); err != nil {
				b.Fatalf("iperf3 output: %v: %s", err, out)
			}
			return r.End.SumReceived.BitsPerSecond, rtt
		}
		if !strings.Contains(string(out), "connect") {
			break
		}
	}
	b.Fatalf("iperf3 %s -> %s: %v: %s", from.Name, to.Name, err, out)
	return 0, 0
}
