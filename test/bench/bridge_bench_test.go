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
// per mode; their samples are pooled.
const bridgeBenchRounds = 2

// BenchmarkBridge runs a bridge + host-local conflist through libcni for 100
// pods, one at a time and 20 at a time, with meshwire's plugins and with the
// reference plugins from /usr/lib/cni in the same run, and reports ADD, CHECK
// and DEL median and p95 with the ratios meshwire/reference. Each mode has
// bridgeBenchRounds runs per implementation, alternating which goes first,
// each on a settled machine.
func BenchmarkBridge(b *testing.B) {
	h := harness.New(b)
	impls := []struct{ name, dir string }{{"meshwire", h.BinDir}, {"reference", harness.ReferenceDir}}
	modes := []int{1, bridgeBenchParallel}
	res := map[string]map[int]*bridgeBenchOps{}
	for _, impl := range impls {
		res[impl.name] = map[int]*bridgeBenchOps{}
		for _, par := range modes {
			res[impl.name][par] = &bridgeBenchOps{}
		}
	}
	for i := 0; i < b.N; i++ {
		for _, par := range modes {
			for round := 0; round < bridgeBenchRounds; round++ {
				order := impls
				if round%2 == 1 {
					order = []struct{ name, dir string }{impls[1], impls[0]}
				}
				for _, impl := range order {
					res[impl.name][par].pool(bridgeBenchRun(b, impl.dir, par))
				}
			}
		}
	}
	t := &harness.Table{
		Title:  fmt.Sprintf("bridge + host-local: %d pods through libcni, %d runs per row (ms; ratio = meshwire / reference median)", bridgeBenchPods, bridgeBenchRounds*b.N),
		Header: []string{"op", "concurrency", "meshwire median", "meshwire p95", "reference median", "reference p95", "ratio"},
	}
	for _, op := range []string{"ADD", "CHECK", "DEL"} {
		for _, par := range modes {
			m, r := res["meshwire"][par].get(op), res["reference"][par].get(op)
			t.Add(op, fmt.Sprint(par), harness.Ms(m.Median()), harness.Ms(m.P95()), harness.Ms(r.Median()), harness.Ms(r.P95()), harness.Ratio(m.Median(), r.Median()))
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

// bridgeBenchRun wires bridgeBenchPods namespaces with the plugins in dir,
// par at a time, checks and removes them, timing each call. It removes its
// namespaces and the bridge before it returns, and starts once the machine
// has settled from whatever ran before.
func bridgeBenchRun(b *testing.B, dir string, par int) *bridgeBenchOps {
	cni := libcni.NewCNIConfigWithCacheDir([]string{dir}, b.TempDir(), nil)
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
	if !harness.WaitIdle(30 * time.Second) {
		b.Logf("the machine did not settle before the %s run (%d at a time)", dir, par)
	}
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
						b.Errorf("%s %s (%s): %v", name, rt.NetNS, dir, err)
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
