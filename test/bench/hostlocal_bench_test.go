package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
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
	hostLocalBenchNet     = "mwt-hl-bench"
	hostLocalBenchSamples = 15 // reference cycles per size (about 1 s each at 50,000)
	hostLocalBenchPerRef  = 3  // meshwire cycles per reference cycle: cheap, and a steadier median
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

// hostLocalRun is one plugin binary with its own data directory.
type hostLocalRun struct {
	name     string
	path     string
	conf     []byte
	add, del harness.Samples
}

// cycle runs one ADD and one DEL the way an interface plugin runs its IPAM
// plugin (invoke, as ipam.ExecAdd does), timing each.
func (r *hostLocalRun) cycle(b *testing.B, i int) {
	args := &invoke.Args{ContainerID: fmt.Sprintf("bench%s%d", r.name, i), NetNS: "/var/run/netns/mwt-hl-none", IfName: "eth0", Path: filepath.Dir(r.path)}
	ctx := context.Background()
	err := r.add.Time(func() error {
		args.Command = "ADD"
		_, err := invoke.ExecPluginWithResult(ctx, r.path, r.conf, args, nil)
		return err
	})
	if err != nil {
		b.Fatalf("%s ADD: %v", r.name, err)
	}
	err = r.del.Time(func() error {
		args.Command = "DEL"
		return invoke.ExecPluginWithoutResult(ctx, r.path, r.conf, args, nil)
	})
	if err != nil {
		b.Fatalf("%s DEL: %v", r.name, err)
	}
}

// BenchmarkHostLocal: ADD and DEL median latency of meshwire's host-local
// and the reference's, with 0, 10,000 and 50,000 addresses already
// allocated in a /16, in the same run. meshwire's samples rotate over the
// three sizes so that its own 50,000/0 ratio sees the same machine load;
// the reference runs afterwards, one size at a time, so that neither
// plugin's file system work (and the journal commits it causes) lands in
// the other's samples.
func BenchmarkHostLocal(b *testing.B) {
	bin := filepath.Join(harness.BinDir(b), "host-local")
	ref := filepath.Join(harness.ReferenceDir, "host-local")
	if _, err := os.Stat(ref); err != nil {
		b.Fatalf("reference plugin: %v (install containernetworking-plugins)", err)
	}
	sizes := []int{0, 10000, 50000}
	for n := 0; n < b.N; n++ {
		mw := make([]*hostLocalRun, len(sizes))
		for i, size := range sizes {
			dir := b.TempDir()
			prefillMeshwire(b, dir, size)
			mw[i] = &hostLocalRun{name: "meshwire", path: bin, conf: hostLocalBenchConf(dir)}
			mw[i].cycle(b, -1) // the store's first open imports the directory once
			mw[i].add, mw[i].del = nil, nil
		}
		unix.Sync() // write the prefill back now, not during the samples
		for i := 0; i < hostLocalBenchSamples*hostLocalBenchPerRef; i++ {
			for _, r := range mw {
				r.cycle(b, i)
			}
		}
		rf := make([]*hostLocalRun, len(sizes))
		for i, size := range sizes {
			dir := b.TempDir()
			prefillReference(b, dir, size)
			rf[i] = &hostLocalRun{name: "reference", path: ref, conf: hostLocalBenchConf(dir)}
			rf[i].cycle(b, -1) // the first walk also updates the files' atimes
			rf[i].add, rf[i].del = nil, nil
			unix.Sync()
			for k := 0; k < hostLocalBenchSamples; k++ {
				rf[i].cycle(b, k)
			}
		}
		table := harness.Table{
			Title:  "host-local: median latency (ms) of one ADD / DEL, binary run as a runtime would",
			Header: []string{"allocated", "meshwire ADD", "reference ADD", "reference/meshwire", "meshwire DEL", "reference DEL", "reference/meshwire"},
		}
		for i, size := range sizes {
			m, r := mw[i], rf[i]
			table.Add(strconv.Itoa(size),
				harness.Ms(m.add.Median()), harness.Ms(r.add.Median()), harness.Ratio(r.add.Median(), m.add.Median()),
				harness.Ms(m.del.Median()), harness.Ms(r.del.Median()), harness.Ratio(r.del.Median(), m.del.Median()))
			b.ReportMetric(float64(m.add.Median().Microseconds())/1000, fmt.Sprintf("ms-mw-add-%d", size))
			b.ReportMetric(float64(r.add.Median().Microseconds())/1000, fmt.Sprintf("ms-ref-add-%d", size))
		}
		table.Write(os.Stdout)
		last := len(sizes) - 1
		fmt.Fprintf(os.Stdout, "meshwire ADD at 50,000 / at 0: %s (target <= 1.5x); reference / meshwire ADD at 50,000: %s (target >= 20x)\n",
			harness.Ratio(mw[last].add.Median(), mw[0].add.Median()), harness.Ratio(rf[last].add.Median(), mw[last].add.Median()))
		b.ReportMetric(float64(mw[last].add.Median())/float64(mw[0].add.Median()), "mw-add-50k/0")
		hostLocalBenchUpgrade(b, bin, sizes[last])
	}
}

// hostLocalBenchUpgrade: meshwire on a node upgraded from the reference,
// its data directory holding the reference's files. The first command
// imports them (once); later ADD and DEL cost what they cost on a node
// that never ran the reference.
func hostLocalBenchUpgrade(b *testing.B, bin string, size int) {
	dir := b.TempDir()
	prefillReference(b, dir, size)
	unix.Sync()
	r := &hostLocalRun{name: "meshwire", path: bin, conf: hostLocalBenchConf(dir)}
	r.cycle(b, -1)
	first := r.add[0]
	r.add, r.del = nil, nil
	for i := 0; i < hostLocalBenchSamples*hostLocalBenchPerRef; i++ {
		r.cycle(b, i)
	}
	table := harness.Table{
		Title:  fmt.Sprintf("host-local: meshwire on a node upgraded from the reference (%d reference files), ms", size),
		Header: []string{"first ADD (imports the files)", "ADD median after", "DEL median after"},
	}
	table.Add(harness.Ms(first), harness.Ms(r.add.Median()), harness.Ms(r.del.Median()))
	table.Write(os.Stdout)
}
