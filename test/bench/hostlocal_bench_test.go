//go:build kernel

package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/hostlocal/store"
	"github.com/meshwire/meshwire/test/harness"
)

// hostLocalBenchNet is the benchmark's network: a /16 of the range assigned
// to host-local benchmarks.
const (
	hostLocalBenchNet = "mwt-hl-bench"
	// Every implementation makes hostLocalBenchRounds rounds of
	// hostLocalBenchPerRound cycles per size (a reference cycle takes about
	// 1.6 s at 50,000). Rounds are a multiple of the three implementations,
	// so that each goes first, second and last as often.
	hostLocalBenchRounds   = 6
	hostLocalBenchPerRound = 5
)

func hostLocalBenchConf(dataDir string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"type":"bridge","ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.19.0.0/16"}]]}}`, hostLocalBenchNet, dataDir))
}

// hostLocalBenchIP is the i-th address handed out from 198.19.0.0/16 (the
// gateway 198.19.0.1 is skipped, so the first is 198.19.0.2).
func hostLocalBenchIP(i int) net.IP {
	a := make(net.IP, 4)
	binary.BigEndian.PutUint32(a, binary.BigEndian.Uint32(net.IPv4(198, 19, 0, 2).To4())+uint32(i))
	return a
}

// prefillMeshwire allocates n addresses through meshwire's store API, as n
// earlier ADDs would have.
func prefillMeshwire(b *testing.B, dataDir string, n int) {
	s, err := store.Open(dataDir, hostLocalBenchNet, 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	err = s.Update(func(tx *store.Tx) error {
		for i := 0; i < n; i++ {
			o := store.Owner{ID: "prefill" + strconv.Itoa(i), IfName: "eth0"}
			if err := tx.Reserve(store.Allocation{IP: hostLocalBenchIP(i), Owner: o}); err != nil {
				return err
			}
		}
		if n > 0 {
			return tx.SetLastReserved(0, hostLocalBenchIP(n-1))
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// prefillReference writes the reference plugin's layout directly: one file
// per address holding "containerid\r\nifname", plus last_reserved_ip.0.
func prefillReference(b *testing.B, dataDir string, n int) {
	dir := filepath.Join(dataDir, hostLocalBenchNet)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i++ {
		content := "prefill" + strconv.Itoa(i) + store.LineBreak + "eth0"
		if err := os.WriteFile(filepath.Join(dir, hostLocalBenchIP(i).String()), []byte(content), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	if n > 0 {
		if err := os.WriteFile(filepath.Join(dir, store.LastReservedPrefix+"0"), []byte(hostLocalBenchIP(n-1).String()), 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

// hostLocalRun is one implementation's host-local with one data directory.
type hostLocalRun struct {
	impl     impl
	path     string
	conf     []byte
	add, del harness.Samples
}

// cycle runs one ADD and one DEL the way an interface plugin runs its IPAM
// plugin (invoke, as ipam.ExecAdd does), timing each.
func (r *hostLocalRun) cycle(b *testing.B, i int) {
	args := &invoke.Args{ContainerID: fmt.Sprintf("bench%s%d", r.impl.tag, i), NetNS: "/var/run/netns/mwt-hl-none", IfName: "eth0", Path: filepath.Dir(r.path)}
	ctx := context.Background()
	err := r.add.Time(func() error {
		args.Command = "ADD"
		_, err := invoke.ExecPluginWithResult(ctx, r.path, r.conf, args, nil)
		return err
	})
	if err != nil {
		b.Fatalf("%s ADD: %v", r.impl.name, err)
	}
	err = r.del.Time(func() error {
		args.Command = "DEL"
		return invoke.ExecPluginWithoutResult(ctx, r.path, r.conf, args, nil)
	})
	if err != nil {
		b.Fatalf("%s DEL: %v", r.impl.name, err)
	}
}

// BenchmarkHostLocal: ADD and DEL median latency of meshwire's host-local
// and the peers' (reference v1.9.1, Debian's 1.1.1), with 0, 10,000 and
// 50,000 addresses already allocated in a /16, in the same run. Every
// implementation gets the same samples in the same shape: rounds of
// hostLocalBenchPerRound cycles, each cycle rotating over the three sizes
// (so that a ratio between sizes sees one machine load); in each round the
// implementations take turns, one whole block each on a settled machine
// (so that neither's file system work, and the journal commits it causes,
// lands in the other's samples), and the round decides which goes first.
func BenchmarkHostLocal(b *testing.B) {
	ps := peers(b)
	harness.New(b) // root, and the node-wide lock: no other kernel test runs meanwhile
	mw := impl{name: "meshwire", tag: "mw", dir: harness.BinDir(b), meshwire: true}
	impls := implsWith(mw, ps)
	sizes := []int{0, 10000, 50000}
	for n := 0; n < b.N; n++ {
		runs := make([][]*hostLocalRun, len(impls)) // [impl][size]
		for k, im := range impls {
			for _, size := range sizes {
				dir := b.TempDir()
				if im.meshwire {
					prefillMeshwire(b, dir, size)
				} else {
					prefillReference(b, dir, size)
				}
				r := &hostLocalRun{impl: im, path: filepath.Join(im.dir, "host-local"), conf: hostLocalBenchConf(dir)}
				// meshwire's store imports the directory on its first open;
				// the reference's first walk updates the files' atimes.
				r.cycle(b, -1)
				r.add, r.del = nil, nil
				runs[k] = append(runs[k], r)
			}
		}
		unix.Sync() // write the prefill back now, not during the samples
		for round := 0; round < hostLocalBenchRounds; round++ {
			for _, im := range rotate(impls, round) {
				k := slices.IndexFunc(impls, func(x impl) bool { return x.name == im.name })
				unix.Sync()
				settle(b, im, "host-local round")
				for c := 0; c < hostLocalBenchPerRound; c++ {
					for _, r := range runs[k] {
						r.cycle(b, round*hostLocalBenchPerRound+c)
					}
				}
			}
		}
		for _, op := range []string{"ADD", "DEL"} {
			table := harness.Table{
				Title:  fmt.Sprintf("host-local: median latency (ms) of one %s, binary run as a runtime would, %d samples each", op, hostLocalBenchRounds*hostLocalBenchPerRound),
				Header: []string{"allocated", "meshwire"},
			}
			for _, p := range ps {
				table.Header = append(table.Header, p.name)
			}
			for _, p := range ps {
				table.Header = append(table.Header, shortName(p)+" / meshwire")
			}
			for i, size := range sizes {
				get := func(k int) time.Duration {
					if op == "ADD" {
						return runs[k][i].add.Median()
					}
					return runs[k][i].del.Median()
				}
				cells := []string{strconv.Itoa(size)}
				for k := range impls {
					cells = append(cells, harness.Ms(get(k)))
				}
				for k := 1; k < len(impls); k++ {
					cells = append(cells, harness.Ratio(get(k), get(0)))
				}
				table.Add(cells...)
			}
			table.Write(os.Stdout)
		}
		last := len(sizes) - 1
		for k, im := range impls {
			b.ReportMetric(float64(runs[k][last].add.Median().Microseconds())/1000, fmt.Sprintf("ms-%s-add-%d", im.tag, sizes[last]))
		}
		m := runs[0]
		fmt.Fprintf(os.Stdout, "meshwire ADD at 50,000 / at 0: %s (target <= 1.5x)\n", harness.Ratio(m[last].add.Median(), m[0].add.Median()))
		for k, p := range ps {
			fmt.Fprintf(os.Stdout, "%s / meshwire ADD at 50,000: %s (target >= 20x)\n", p.name, harness.Ratio(runs[k+1][last].add.Median(), m[last].add.Median()))
		}
		b.ReportMetric(float64(m[last].add.Median())/float64(m[0].add.Median()), "mw-add-50k/0")
		hostLocalBenchUpgrade(b, mw, sizes[last])
	}
}

// hostLocalBenchUpgrade: meshwire on a node upgraded from the reference,
// its data directory holding the reference's files. The first command
// imports them (once); later ADD and DEL cost what they cost on a node
// that never ran the reference.
func hostLocalBenchUpgrade(b *testing.B, mw impl, size int) {
	dir := b.TempDir()
	prefillReference(b, dir, size)
	unix.Sync()
	settle(b, mw, "upgrade run")
	r := &hostLocalRun{impl: mw, path: filepath.Join(mw.dir, "host-local"), conf: hostLocalBenchConf(dir)}
	r.cycle(b, -1)
	first := r.add[0]
	r.add, r.del = nil, nil
	for i := 0; i < hostLocalBenchRounds*hostLocalBenchPerRound; i++ {
		r.cycle(b, i)
	}
	table := harness.Table{
		Title:  fmt.Sprintf("host-local: meshwire on a node upgraded from the reference (%d reference files), ms", size),
		Header: []string{"first ADD (imports the files)", "ADD median after", "DEL median after"},
	}
	table.Add(harness.Ms(first), harness.Ms(r.add.Median()), harness.Ms(r.del.Median()))
	table.Write(os.Stdout)
}
