//go:build kernel

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
// shapes a pod's traffic, side by side with each peer's (reference v1.9.1,
// Debian's 1.1.1) in the same run: iperf3 between the shaped pod and a
// second, unshaped pod (both on v1.9.1's ptp and host-local, whichever
// bandwidth plugin shapes), ingress (to the pod) and egress (from the pod)
// at 10 Mbit/s, 100 Mbit/s and 1 Gbit/s, with the ratio
// achieved/configured; and the ping round trip through the shaped link,
// idle and while iperf3 fills it. For each scenario the implementations
// take turns, rotating which goes first, each on a settled machine.
//
// Every plugin gets the same config: rate R and a burst of R × 20 ms, and,
// to show what a runtime's large burst does to the queue, 10 Mbit/s with
// the burst containerd and CRI-O pass (2^32-1 bits). iperf3 runs
// bandwidthBenchSeconds seconds and omits the first one (slow start and the
// initial burst).
func BenchmarkBandwidth(b *testing.B) {
	ps := peers(b)
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
	impls := implsWith(impl{name: "meshwire", tag: "mw", dir: h.BinDir, meshwire: true}, ps)
	base := ps[0].dir // the newest reference's ptp and host-local under every bandwidth plugin
	paths := map[string]string{}
	for _, im := range impls {
		paths[im.name] = binDirWith(b, base, map[string]string{"bandwidth": filepath.Join(im.dir, "bandwidth")})
	}

	thr := &harness.Table{
		Title:  "bandwidth: achieved throughput (iperf3 TCP, Mbit/s, ratio achieved/configured)",
		Header: []string{"direction", "configured"},
	}
	for _, im := range impls {
		thr.Header = append(thr.Header, im.name, im.name+" ratio")
	}
	lat := &harness.Table{
		Title:  "bandwidth: ping round trip through the shaped link (median of 20, ms; ratio = meshwire / peer)",
		Header: []string{"configured", "link"},
	}
	for _, im := range impls {
		lat.Header = append(lat.Header, im.name)
	}
	lat.Header = append(lat.Header, "unshaped")
	for _, p := range ps {
		lat.Header = append(lat.Header, "vs "+shortName(p))
	}
	for i := 0; i < b.N; i++ {
		// Unshaped baseline.
		settle(b, impls[0], "unshaped baseline")
		basePods := newBandwidthBenchPods(b, h, paths["meshwire"], "", 0, 0)
		baseIdle := bandwidthBenchPing(b, basePods, nil)
		basePods.close()
		type res struct {
			in, out         float64
			idle, inL, outL time.Duration
		}
		results := map[string]map[scenario]res{}
		for _, im := range impls {
			results[im.name] = map[scenario]res{}
		}
		for si, sc := range scenarios {
			for _, im := range rotate(impls, si+i) {
				settle(b, im, "bandwidth "+sc.label)
				p := newBandwidthBenchPods(b, h, paths[im.name], im.tag, sc.rate, sc.burst)
				var r res
				r.idle = bandwidthBenchPing(b, p, nil)
				r.in, r.inL = bandwidthBenchIperf(b, p.peer, p.pod, p.podIP, p)
				r.out, r.outL = bandwidthBenchIperf(b, p.pod, p.peer, p.peerIP, p)
				p.close()
				results[im.name][sc] = r
			}
		}
		for _, dir := range []string{"ingress", "egress"} {
			for _, sc := range scenarios {
				cells := []string{dir, sc.label}
				for _, im := range impls {
					got := results[im.name][sc].in
					if dir == "egress" {
						got = results[im.name][sc].out
					}
					cells = append(cells, fmt.Sprintf("%.1f", got/1e6), fmt.Sprintf("%.2f", got/float64(sc.rate)))
				}
				thr.Add(cells...)
			}
		}
		for _, sc := range scenarios {
			for _, link := range []string{"idle", "ingress full", "egress full"} {
				get := func(name string) time.Duration {
					r := results[name][sc]
					switch link {
					case "idle":
						return r.idle
					case "ingress full":
						return r.inL
					}
					return r.outL
				}
				cells := []string{sc.label, link}
				for _, im := range impls {
					cells = append(cells, harness.Ms(get(im.name)))
				}
				if link == "idle" {
					cells = append(cells, harness.Ms(baseIdle))
				} else {
					cells = append(cells, "")
				}
				for _, p := range ps {
					cells = append(cells, harness.Ratio(get("meshwire"), get(p.name)))
				}
				lat.Add(cells...)
			}
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
func newBandwidthBenchPods(b *testing.B, h *harness.H, path, tag string, rate, burst uint64) *bandwidthBenchPods {
	p := &bandwidthBenchPods{b: b, cni: libcni.NewCNIConfigWithCacheDir([]string{path}, b.TempDir(), nil)}
	ipam := fmt.Sprintf(`{"type":"host-local","ranges":[[{"subnet":"198.18.46.0/24"}]],"dataDir":%q}`, b.TempDir())
	ptp := fmt.Sprintf(`{"type":"ptp","ipam":%s}`, ipam)
	shaped := ptp
	if rate > 0 {
		shaped += fmt.Sprintf(`,{"type":"bandwidth","ingressRate":%d,"ingressBurst":%d,"egressRate":%d,"egressBurst":%d}`, rate, burst, rate, burst)
	}
	name := "bw-bench-" + tag
	if tag == "" {
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
