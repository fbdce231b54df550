package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshwire/meshwire/test/harness"
)

// referenceVersion is the newest release of the reference plugins
// (github.com/containernetworking/plugins): the peer to beat. The
// benchmarks build it from the Go module proxy, once per process.
const referenceVersion = "v1.9.1"

// referenceModule and referencePlugins: what the benchmarks run of it.
const referenceModule = "github.com/containernetworking/plugins"

var referencePlugins = []string{"main/bridge", "main/ptp", "main/loopback", "ipam/host-local", "meta/portmap", "meta/bandwidth"}

// impl is one implementation a benchmark runs side by side with the
// others: meshwire's plugins or a peer's.
type impl struct {
	name     string // column title
	tag      string // short, for container ids and network names
	dir      string // the directory of its plugin binaries (CNI_PATH)
	meshwire bool
}

var (
	refOnce sync.Once
	refDir  string
	refErr  error
)

// buildReference installs the reference plugins of referenceVersion into a
// fresh temporary directory with `go install pkg@version`: the module's own
// go.mod and go.sum decide every dependency, not meshwire's, and the build
// is the release's (static, -trimpath, the version stamped), so the
// binaries are those a node would download. The Go build and module caches
// make later runs take a second or two.
func buildReference() (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = "/usr/local/go/bin/go" // where the machines have it, off PATH for `go test` run by hand
	}
	dir, err := os.MkdirTemp("", "meshwire-reference-"+referenceVersion+"-")
	if err != nil {
		return "", err
	}
	args := []string{"install", "-ldflags", "-X " + referenceModule + "/pkg/utils/buildversion.BuildVersion=" + referenceVersion}
	for _, p := range referencePlugins {
		args = append(args, referenceModule+"/plugins/"+p+"@"+referenceVersion)
	}
	cmd := exec.Command(goTool, args...)
	// Outside any module (the working directory is the benchmark's package),
	// and with flags of its own: an inherited -mod=vendor or GOWORK would
	// refuse a pkg@version install.
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod -trimpath", "GOWORK=off", "CGO_ENABLED=0")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, p := range referencePlugins {
		if _, err := os.Stat(filepath.Join(dir, filepath.Base(p))); err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("reference %s: %v", referenceVersion, err)
		}
	}
	fmt.Fprintf(os.Stderr, "reference plugins %s built into %s in %s\n", referenceVersion, dir, time.Since(start).Round(100*time.Millisecond))
	return dir, nil
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
// this order: the newest release (built on first use, once per process)
// and Debian's package in /usr/lib/cni (test/deps.sh installs it). Call it
// before harness.New: the build then runs before the node-wide test lock is
// taken.
func peers(b testing.TB) []impl {
	b.Helper()
	refOnce.Do(func() { refDir, refErr = buildReference() })
	if refErr != nil {
		b.Fatalf("building the reference plugins %s: %v", referenceVersion, refErr)
	}
	if _, err := os.Stat(filepath.Join(harness.ReferenceDir, "bridge")); err != nil {
		b.Fatalf("Debian's reference plugins: %v (install containernetworking-plugins; make bench runs test/deps.sh)", err)
	}
	return []impl{
		{name: "reference " + referenceVersion, tag: "v191", dir: refDir},
		{name: "Debian " + debianVersion(), tag: "deb", dir: harness.ReferenceDir},
	}
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
func settle(b testing.TB, i impl, what string) {
	if !harness.WaitIdle(30 * time.Second) {
		b.Logf("the machine did not settle before %s's %s", i.name, what)
	}
}

// TestMain removes the reference build when the benchmarks are done.
func TestMain(m *testing.M) {
	code := m.Run()
	if refDir != "" {
		_ = os.RemoveAll(refDir)
	}
	os.Exit(code)
}
