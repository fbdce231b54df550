//go:build kernel

package bench

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/test/harness"
)

// The bridge benchmark's network: bridge mwbench0, 198.18.26.0/24 (bridge
// tests' range), gateway on the bridge and masquerade, as a typical node
// config for pods.
const (
	bridgeBenchPods     = 100
	bridgeBenchParallel = 20
	bridgeBenchBridge   = "mwbench0"
)

func bridgeBenchConf(dataDir string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"mwtb-bench","plugins":[{"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":true,"hostVethPrefix":"mwtb",
"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.26.0/24"}]]}}]}`, bridgeBenchBridge, dataDir))
}

// bridgeBenchOps are the latencies of one implementation in one mode.
type bridgeBenchOps struct{ add, check, del harness.Samples }

// bridgeBenchRounds is how many runs of 100 pods each implementation makes
// per mode; their samples are pooled. A multiple of the three
// implementations, so that each goes first, second and last as often.
const bridgeBenchRounds = 3

// BenchmarkBridge runs a bridge + host-local conflist through libcni for 100
// pods, one at a time and 20 at a time, with meshwire's plugins and with
// each peer's (reference v1.9.1, Debian's 1.1.1) in the same run, and
// reports ADD, CHECK and DEL median and p95 with the ratios
// meshwire/peer. Each mode has bridgeBenchRounds runs per implementation,
// rotating which goes first, each on a settled machine.
func BenchmarkBridge(b *testing.B) {
	ps := peers(b)
	h := harness.New(b)
	impls := implsWith(impl{name: "meshwire", tag: "mw", dir: h.BinDir, meshwire: true}, ps)
	modes := []int{1, bridgeBenchParallel}
	res := map[string]map[int]*bridgeBenchOps{}
	for _, im := range impls {
		res[im.name] = map[int]*bridgeBenchOps{}
		for _, par := range modes {
			res[im.name][par] = &bridgeBenchOps{}
		}
	}
	for i := 0; i < b.N; i++ {
		for _, par := range modes {
			for round := 0; round < bridgeBenchRounds; round++ {
				for _, im := range rotate(impls, round) {
					res[im.name][par].pool(bridgeBenchRun(b, im, par))
				}
			}
		}
	}
	t := &harness.Table{
		Title:  fmt.Sprintf("bridge + host-local: %d pods through libcni, %d runs per cell (ms; ratio = meshwire / peer median)", bridgeBenchPods, bridgeBenchRounds*b.N),
		Header: []string{"op", "concurrency"},
	}
	for _, im := range impls {
		t.Header = append(t.Header, im.name+" median", im.name+" p95")
	}
	for _, p := range ps {
		t.Header = append(t.Header, "vs "+shortName(p))
	}
	for _, op := range []string{"ADD", "CHECK", "DEL"} {
		for _, par := range modes {
			m := res["meshwire"][par].get(op)
			cells := []string{op, fmt.Sprint(par)}
			for _, im := range impls {
				s := res[im.name][par].get(op)
				cells = append(cells, harness.Ms(s.Median()), harness.Ms(s.P95()))
			}
			for _, p := range ps {
				cells = append(cells, harness.Ratio(m.Median(), res[p.name][par].get(op).Median()))
			}
			t.Add(cells...)
		}
	}
	t.Write(os.Stdout)
}

func (o *bridgeBenchOps) pool(run *bridgeBenchOps) {
	o.add = append(o.add, run.add...)
	o.check = append(o.check, run.check...)
	o.del = append(o.del, run.del...)
}

func (o *bridgeBenchOps) get(op string) harness.Samples {
	switch op {
	case "ADD":
		return o.add
	case "CHECK":
		return o.check
	}
	return o.del
}

// bridgeBenchRun wires bridgeBenchPods namespaces with im's plugins,
// par at a time, checks and removes them, timing each call. It removes its
// namespaces and the bridge before it returns, and starts once the machine
// has settled from whatever ran before.
func bridgeBenchRun(b *testing.B, im impl, par int) *bridgeBenchOps {
	cni := libcni.NewCNIConfigWithCacheDir([]string{im.dir}, b.TempDir(), nil)
	list, err := libcni.ConfListFromBytes(bridgeBenchConf(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	rts := make([]*libcni.RuntimeConf, bridgeBenchPods)
	names := make([]string, 0, bridgeBenchPods)
	defer func() {
		ctx := context.Background()
		for _, rt := range rts {
			if rt != nil && b.Failed() {
				_ = cni.DelNetworkList(ctx, list, rt)
			}
		}
		for _, name := range names {
			_ = netns.Delete(name)
		}
		if l, err := netlink.LinkByName(bridgeBenchBridge); err == nil {
			_ = netlink.LinkDel(l)
		}
	}()
	for i := range rts {
		name := fmt.Sprintf("mwt-bench-%s", harness.RandomID()[:8])
		p, err := netns.Create(name)
		if err != nil {
			b.Fatal(err)
		}
		names = append(names, name)
		rts[i] = &libcni.RuntimeConf{ContainerID: harness.RandomID(), NetNS: p, IfName: "eth0"}
	}
	settle(b, im, fmt.Sprintf("run (%d at a time)", par))
	ops := &bridgeBenchOps{}
	phase := func(s *harness.Samples, name string, fn func(context.Context, *libcni.NetworkConfigList, *libcni.RuntimeConf) error) {
		var mu sync.Mutex
		work := make(chan *libcni.RuntimeConf)
		var wg sync.WaitGroup
		for w := 0; w < par; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for rt := range work {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					start := time.Now()
					err := fn(ctx, list, rt)
					d := time.Since(start)
					cancel()
					if err != nil {
						b.Errorf("%s %s (%s): %v", name, rt.NetNS, im.name, err)
					}
					mu.Lock()
					*s = append(*s, d)
					mu.Unlock()
				}
			}()
		}
		for _, rt := range rts {
			work <- rt
		}
		close(work)
		wg.Wait()
		if b.Failed() {
			b.FailNow()
		}
	}
	phase(&ops.add, "ADD", func(ctx context.Context, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
		_, err := cni.AddNetworkList(ctx, l, rt)
		return err
	})
	phase(&ops.check, "CHECK", cni.CheckNetworkList)
	phase(&ops.del, "DEL", cni.DelNetworkList)
	return ops
}
