//go:build kernel

package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/test/harness"
)

// impl is one implementation a benchmark runs side by side with the
// others: meshwire's plugins or a peer's.
type impl struct {
	name     string // column title
	tag      string // short, for container ids and network names
	dir      string // the directory of its plugin binaries (CNI_PATH)
	meshwire bool
}

// binDirWith is a CNI bin directory (CNI_PATH) of symlinks to every plugin
// of base, with the plugins named in swap linked to the given binaries
// instead (or added).
func binDirWith(b *testing.B, base string, swap map[string]string) string {
	dir := b.TempDir()
	entries, err := os.ReadDir(base)
	if err != nil {
		b.Fatal(err)
	}
	links := map[string]string{}
	for _, e := range entries {
		links[e.Name()] = filepath.Join(base, e.Name())
	}
	for name, bin := range swap {
		links[name] = bin
	}
	for name, bin := range links {
		if err := os.Symlink(bin, filepath.Join(dir, name)); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// debianVersion is the upstream version of Debian's
// containernetworking-plugins package ("1.1.1" from "1.1.1+ds1-3+b5").
func debianVersion() string {
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "containernetworking-plugins").Output()
	v := strings.TrimSpace(string(out))
	if err != nil || v == "" {
		return "1.1.1"
	}
	if i := strings.IndexAny(v, ":"); i >= 0 {
		v = v[i+1:]
	}
	if i := strings.IndexAny(v, "+-~"); i > 0 {
		v = v[:i]
	}
	return v
}

// peers returns the reference plugins every benchmark compares against, in
// this order: the newest release (harness.ReferenceBinDir builds it from
// the Go module proxy on first use) and Debian's package in /usr/lib/cni
// (test/deps.sh installs it). Call it before harness.New: the build then
// runs before the node-wide test lock is taken.
func peers(b testing.TB) []impl {
	b.Helper()
	refDir := harness.ReferenceBinDir(b)
	if _, err := os.Stat(filepath.Join(harness.ReferenceDir, "bridge")); err != nil {
		b.Fatalf("Debian's reference plugins: %v (install containernetworking-plugins; make bench runs test/deps.sh)", err)
	}
	ps := []impl{
		{name: "reference " + harness.ReferenceVersion, tag: "v191", dir: refDir},
		{name: "Debian " + debianVersion(), tag: "deb", dir: harness.ReferenceDir},
	}
	if base, ok := baseline(b); ok {
		ps = append(ps, base)
	}
	return ps
}

// baseline is the earlier meshwire build MESHWIRE_BENCH_BASELINE names
// (the BIN of a `make build` at another commit), run as one more peer to
// compare a change with what it changes in the same run.
func baseline(b testing.TB) (impl, bool) {
	dir := os.Getenv("MESHWIRE_BENCH_BASELINE")
	if dir == "" {
		return impl{}, false
	}
	for _, p := range []string{"bridge", "portmap", "host-local", "iptables-init"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			b.Fatalf("MESHWIRE_BENCH_BASELINE: %v", err)
		}
	}
	return impl{name: "baseline", tag: "base", dir: dir, meshwire: true}, true
}

// implsWith returns meshwire (first) and the peers.
func implsWith(meshwire impl, ps []impl) []impl {
	return append([]impl{meshwire}, ps...)
}

// rotate returns impls in the order of the given round: round 0 as given,
// round 1 starting with the second, and so on, so that over len(impls)
// rounds each goes first, second and last once.
func rotate[T any](impls []T, round int) []T {
	k := round % len(impls)
	return append(append([]T(nil), impls[k:]...), impls[:k]...)
}

// shortName is a peer's name without "reference ", for narrow columns.
func shortName(i impl) string { return strings.TrimPrefix(i.name, "reference ") }

// settle waits for the machine to settle before a timed run of impl.
func settle(b testing.TB, i impl, what string) { waitSettled(b, i.name+"'s "+what) }

// waitSettled waits (at most 30 s) for the machine to settle before what.
func waitSettled(b testing.TB, what string) {
	if !harness.WaitIdle(30 * time.Second) {
		b.Logf("the machine did not settle before %s", what)
	}
}
