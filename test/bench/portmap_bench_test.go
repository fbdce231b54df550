//go:build kernel

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/test/harness"
)

// The portmap benchmark's network: bridge mwtpbench0 over 198.18.52.0/24
// (portmap's range), host ports 30000-30999; the prefilled attachments
// claim addresses of the same subnet in a synthetic prevResult (so that
// the host route toward them is the bridge, as for real pods).
const (
	pmBenchNet     = "mwtp-bench"
	pmBenchBridge  = "mwtpbench0"
	pmBenchSamples = 15 // ADD+DEL cycles per cell
	// pmBenchRounds: with no pod mapped, each implementation's cycles come
	// in this many blocks, rotating which implementation goes first (a
	// multiple of the three). With 1,000 mapped, each implementation makes
	// one block between its prefill and its cleanup: a reference prefill
	// takes minutes.
	pmBenchRounds  = 3
	pmBenchPrefill = 1000
	pmBenchWorkers = 8 // parallel prefill and cleanup
)

// pmBenchImpl is an implementation with the extra keys of its portmap
// config: meshwire is pinned to iptables, Debian 1.1.1's only backend and
// what v1.9.1 picks by default on a host with iptables, so that all three
// program the same tables.
type pmBenchImpl struct {
	impl
	portmapKeys string
	dataDir     string // host-local's, kept over the whole benchmark as on a node
}

func pmBenchConf(im pmBenchImpl, dataDir string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":"0.4.0","name":%q,"plugins":[
{"type":"bridge","bridge":%q,"isGateway":true,"hostVethPrefix":"mwtp","ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.52.0/24"}]]}},
{"type":"portmap","capabilities":{"portMappings":true}%s}]}`, pmBenchNet, pmBenchBridge, dataDir, im.portmapKeys))
}

func pmBenchPorts(n int) map[string]any {
	var pms []map[string]any
	for i := 0; i < n; i++ {
		pms = append(pms, map[string]any{"hostPort": 30000 + i, "containerPort": 8000 + i, "protocol": "tcp"})
	}
	return map[string]any{"portMappings": pms}
}

type pmBenchCell struct{ add, del harness.Samples }

// BenchmarkPortmap measures ADD and DEL of bridge + host-local + portmap
// through libcni with 1 and 10 host ports per pod, with 0 and 1,000 pods
// already mapped on the node, for meshwire's plugins and each peer's
// (reference v1.9.1, Debian's 1.1.1) in the same run, the same cycles for
// each, every block of cycles on a settled machine. The 1,000 mapped pods
// are prefilled by running only each implementation's portmap ADD with a
// synthetic prevResult, and removed afterwards.
func BenchmarkPortmap(b *testing.B) {
	ps := peers(b)
	h := harness.New(b)
	impls := []pmBenchImpl{{impl{name: "meshwire", tag: "mw", dir: h.BinDir, meshwire: true}, `,"backend":"iptables"`, b.TempDir()}}
	for _, p := range ps {
		keys := ""
		if p.meshwire { // MESHWIRE_BENCH_BASELINE: configured as meshwire is
			keys = impls[0].portmapKeys
		}
		impls = append(impls, pmBenchImpl{p, keys, b.TempDir()})
	}
	// meshwire's nftables backend is measured in the same run for its own
	// 1,000/0 ratio, after the others in every round.
	nft := pmBenchImpl{impl{name: "meshwire-nftables", tag: "mwnft", dir: h.BinDir, meshwire: true}, `,"backend":"nftables"`, b.TempDir()}
	nss := pmBenchNamespaces(b, pmBenchSamples)
	per := pmBenchSamples / pmBenchRounds
	b.Cleanup(func() {
		if l, err := netlink.LinkByName(pmBenchBridge); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	res := map[string]*pmBenchCell{}
	key := func(impl string, mapped, ports int) string { return fmt.Sprintf("%s/%d/%d", impl, mapped, ports) }
	run := func(im pmBenchImpl, mapped int, nss []string) {
		settle(b, im.impl, fmt.Sprintf("portmap cycles (%d mapped)", mapped))
		for _, ports := range []int{1, 10} {
			k := key(im.name, mapped, ports)
			if res[k] == nil {
				res[k] = &pmBenchCell{}
			}
			res[k].pool(pmBenchRun(b, im, nss, ports))
		}
	}
	for n := 0; n < b.N; n++ {
		for round := 0; round < pmBenchRounds; round++ {
			for _, im := range append(rotate(impls, round+n), nft) {
				run(im, 0, nss[round*per:(round+1)*per])
			}
		}
		for _, im := range append(rotate(impls, n), nft) {
			pmBenchPrefillRun(b, im, pmBenchPrefill)
			run(im, pmBenchPrefill, nss)
			pmBenchClean(b, im, pmBenchPrefill)
		}
		pmBenchRemoveReferenceBase(b)
	}
	t := &harness.Table{
		Title:  fmt.Sprintf("bridge + host-local + portmap through libcni, %d ADD+DEL cycles per cell (ms; ratio = meshwire / peer median)", pmBenchSamples*b.N),
		Header: []string{"op", "host ports", "pods mapped"},
	}
	for _, im := range impls {
		t.Header = append(t.Header, im.name+" median", im.name+" p95")
	}
	for _, p := range ps {
		t.Header = append(t.Header, "vs "+shortName(p))
	}
	for _, op := range []string{"ADD", "DEL"} {
		for _, mapped := range []int{0, pmBenchPrefill} {
			for _, ports := range []int{1, 10} {
				m := res[key("meshwire", mapped, ports)].get(op)
				cells := []string{op, fmt.Sprint(ports), fmt.Sprint(mapped)}
				for _, im := range impls {
					c := res[key(im.name, mapped, ports)].get(op)
					cells = append(cells, harness.Ms(c.Median()), harness.Ms(c.P95()))
				}
				for _, p := range ps {
					cells = append(cells, harness.Ratio(m.Median(), res[key(p.name, mapped, ports)].get(op).Median()))
				}
				t.Add(cells...)
			}
		}
	}
	t.Write(os.Stdout)
	s := &harness.Table{
		Title:  "ADD median with 1,000 pods mapped / with 0 mapped",
		Header: []string{"host ports"},
	}
	for _, im := range impls {
		s.Header = append(s.Header, im.name)
	}
	for _, ports := range []int{1, 10} {
		cells := []string{fmt.Sprint(ports)}
		for _, im := range impls {
			cells = append(cells, harness.Ratio(res[key(im.name, pmBenchPrefill, ports)].add.Median(), res[key(im.name, 0, ports)].add.Median()))
		}
		s.Add(cells...)
	}
	s.Write(os.Stdout)
	nt := &harness.Table{
		Title:  "meshwire with backend nftables, same run (ms)",
		Header: []string{"op", "host ports", "pods mapped", "median", "p95", "1,000 / 0 mapped"},
	}
	for _, op := range []string{"ADD", "DEL"} {
		for _, mapped := range []int{0, pmBenchPrefill} {
			for _, ports := range []int{1, 10} {
				c := res[key(nft.name, mapped, ports)].get(op)
				ratio := ""
				if mapped > 0 {
					ratio = harness.Ratio(c.Median(), res[key(nft.name, 0, ports)].get(op).Median())
				}
				nt.Add(op, fmt.Sprint(ports), fmt.Sprint(mapped), harness.Ms(c.Median()), harness.Ms(c.P95()), ratio)
			}
		}
	}
	nt.Write(os.Stdout)
}

func (c *pmBenchCell) pool(run *pmBenchCell) {
	c.add = append(c.add, run.add...)
	c.del = append(c.del, run.del...)
}

func (c *pmBenchCell) get(op string) harness.Samples {
	if op == "ADD" {
		return c.add
	}
	return c.del
}

// pmBenchNamespaces creates the pods' namespaces once (not timed).
func pmBenchNamespaces(b *testing.B, n int) []string {
	var paths []string
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("mwt-pmb-%d-%s", i, harness.RandomID()[:6])
		p, err := netns.Create(name)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = netns.Delete(name) })
		paths = append(paths, p)
	}
	return paths
}

// pmBenchRun runs one ADD and one DEL per namespace, timing each, after
// one untimed cycle: what a node pays once (the bridge, the base chains,
// the IPAM store, the binaries back in the page cache after another
// implementation's block) stays out of the samples of every
// implementation alike.
func pmBenchRun(b *testing.B, im pmBenchImpl, nss []string, ports int) *pmBenchCell {
	cni := libcni.NewCNIConfigWithCacheDir([]string{im.dir}, b.TempDir(), nil)
	list, err := libcni.ConfListFromBytes(pmBenchConf(im, im.dataDir))
	if err != nil {
		b.Fatal(err)
	}
	cell := &pmBenchCell{}
	ctx := context.Background()
	cycle := func(id string, ns string, add, del *harness.Samples) {
		rt := &libcni.RuntimeConf{ContainerID: id, NetNS: ns, IfName: "eth0", CapabilityArgs: pmBenchPorts(ports)}
		if err := add.Time(func() error { _, err := cni.AddNetworkList(ctx, list, rt); return err }); err != nil {
			b.Fatalf("%s ADD: %v", im.name, err)
		}
		if err := del.Time(func() error { return cni.DelNetworkList(ctx, list, rt) }); err != nil {
			b.Fatalf("%s DEL: %v", im.name, err)
		}
	}
	var warm harness.Samples
	cycle(fmt.Sprintf("pmbench-%s-%d-warm", im.tag, ports), nss[0], &warm, &warm)
	for i, p := range nss {
		cycle(fmt.Sprintf("pmbench-%s-%d-%d", im.tag, ports, i), p, &cell.add, &cell.del)
	}
	return cell
}

// pmBenchPortmapConf is a portmap config as the runtime would pass it
// after the interface plugin: one host port and a synthetic prevResult.
func pmBenchPortmapConf(im pmBenchImpl, i int) []byte {
	conf := map[string]any{
		"cniVersion": "0.4.0", "name": pmBenchNet, "type": "portmap",
		"runtimeConfig": pmBenchPorts(1),
		"prevResult": map[string]any{
			"cniVersion": "0.4.0",
			"interfaces": []map[string]string{{"name": "eth0", "sandbox": "/var/run/netns/mwt-pmb-fill"}},
			"ips":        []map[string]any{{"version": "4", "address": fmt.Sprintf("198.18.52.%d/24", 100+i%150), "interface": 0}},
		},
	}
	conf["runtimeConfig"].(map[string]any)["portMappings"].([]map[string]any)[0]["hostPort"] = 30000 + i%1000
	if im.portmapKeys != "" {
		var extra map[string]any
		_ = json.Unmarshal([]byte("{"+strings.TrimPrefix(im.portmapKeys, ",")+"}"), &extra)
		for k, v := range extra {
			conf[k] = v
		}
	}
	out, _ := json.Marshal(conf)
	return out
}

func pmBenchFillID(im pmBenchImpl, i int) string { return fmt.Sprintf("pmfill-%s-%d", im.tag, i) }

// pmBenchParallel runs fn(i) for i < n on a few workers.
func pmBenchParallel(b *testing.B, n int, fn func(i int) error) {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for w := 0; w < pmBenchWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

func pmBenchExec(im pmBenchImpl, cmd string, i int) error {
	args := &invoke.Args{Command: cmd, ContainerID: pmBenchFillID(im, i), NetNS: "/var/run/netns/mwt-pmb-fill", IfName: "eth0", Path: im.dir}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(im.dir, "portmap")
	if cmd == "ADD" {
		_, err := invoke.ExecPluginWithResult(ctx, path, pmBenchPortmapConf(im, i), args, nil)
		return err
	}
	return invoke.ExecPluginWithoutResult(ctx, path, pmBenchPortmapConf(im, i), args, nil)
}

// pmBenchPrefillRun maps n synthetic pods with the implementation's portmap.
func pmBenchPrefillRun(b *testing.B, im pmBenchImpl, n int) {
	start := time.Now()
	pmBenchParallel(b, n, func(i int) error { return pmBenchExec(im, "ADD", i) })
	b.Logf("%s: prefilled %d mapped pods in %s", im.name, n, time.Since(start).Round(time.Millisecond))
}

// pmBenchClean unmaps the prefilled pods: one GC for meshwire (it keeps
// only the valid attachments of the network), one DEL each for the
// references (their portmap has no GC).
func pmBenchClean(b *testing.B, im pmBenchImpl, n int) {
	start := time.Now()
	if im.meshwire {
		conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"portmap"%s,"cni.dev/valid-attachments":[{"containerID":"none","ifname":"eth0"}]}`, pmBenchNet, im.portmapKeys)
		cmd := exec.Command(filepath.Join(im.dir, "portmap"))
		cmd.Env = append(os.Environ(), "CNI_COMMAND=GC", "CNI_PATH="+im.dir)
		cmd.Stdin = strings.NewReader(conf)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("meshwire GC: %v: %s", err, out)
		}
	} else {
		pmBenchParallel(b, n, func(i int) error { return pmBenchExec(im, "DEL", i) })
	}
	b.Logf("%s: removed %d mapped pods in %s", im.name, n, time.Since(start).Round(time.Millisecond))
}

// pmBenchRemoveReferenceBase removes the chains the reference portmap
// creates once per node and never removes (CNI-HOSTPORT-*), once no
// attachment is left in them, so that the benchmark leaves the host as it
// found it.
func pmBenchRemoveReferenceBase(b *testing.B) {
	for _, tool := range []string{"iptables", "ip6tables"} {
		out, err := exec.Command(tool+"-save", "-t", "nat").Output()
		if err != nil {
			b.Fatalf("%s-save: %v", tool, err)
		}
		var lines []string
		chains := map[string]bool{}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, ":CNI-HOSTPORT-") {
				chains[strings.Fields(l[1:])[0]] = true
			}
			if strings.HasPrefix(l, "-A CNI-HOSTPORT-DNAT ") || strings.HasPrefix(l, ":CNI-DN-") {
				b.Logf("%s: reference attachments left, keeping its base chains", tool)
				chains = nil
				break
			}
		}
		if len(chains) == 0 {
			continue
		}
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) > 2 && f[0] == "-A" && !chains[f[1]] && chains[f[len(f)-1]] {
				lines = append(lines, "-D"+strings.TrimPrefix(l, "-A"))
			}
		}
		for ch := range chains {
			lines = append(lines, "-F "+ch)
		}
		for ch := range chains {
			lines = append(lines, "-X "+ch)
		}
		cmd := exec.Command(tool+"-restore", "--noflush", "-w", "10")
		cmd.Stdin = strings.NewReader("*nat\n" + strings.Join(lines, "\n") + "\nCOMMIT\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("remove the reference's base chains: %v: %s", err, out)
		}
	}
}
