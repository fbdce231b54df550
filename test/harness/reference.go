package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// ReferenceVersion is the release of the reference plugins
// (github.com/containernetworking/plugins) meshwire is a drop-in for: the
// parity tests run it side by side with meshwire's plugins.
const ReferenceVersion = "v1.9.1"

const referenceModule = "github.com/containernetworking/plugins"

// ReferencePlugins are the reference plugins meshwire replaces.
var ReferencePlugins = []string{"main/bridge", "main/ptp", "main/loopback", "ipam/host-local", "meta/portmap", "meta/bandwidth"}

var (
	refOnce sync.Once
	refDir  string
	refErr  error
)

// ReferenceBinDir returns a directory holding the reference plugins of
// ReferenceVersion, built with `go install pkg@version` (the module's own
// go.mod decides every dependency, as for a release build) on first use
// and kept in the temporary directory for later runs: they never change.
// Call it before New, so that the build runs before the node-wide test
// lock is taken.
func ReferenceBinDir(t testing.TB) string {
	t.Helper()
	refOnce.Do(func() { refDir, refErr = buildReference() })
	if refErr != nil {
		t.Fatalf("building the reference plugins %s: %v", ReferenceVersion, refErr)
	}
	return refDir
}

func buildReference() (string, error) {
	dir := filepath.Join(os.TempDir(), "meshwire-reference-"+ReferenceVersion)
	complete := func(d string) bool {
		for _, p := range ReferencePlugins {
			if _, err := os.Stat(filepath.Join(d, filepath.Base(p))); err != nil {
				return false
			}
		}
		return true
	}
	if complete(dir) {
		return dir, nil
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = "/usr/local/go/bin/go" // where the machines have it, off PATH for `go test` run by hand
	}
	tmp, err := os.MkdirTemp("", "meshwire-reference-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	args := []string{"install", "-ldflags", "-X " + referenceModule + "/pkg/utils/buildversion.BuildVersion=" + ReferenceVersion}
	for _, p := range ReferencePlugins {
		args = append(args, referenceModule+"/plugins/"+p+"@"+ReferenceVersion)
	}
	cmd := exec.Command(goTool, args...)
	// Outside any module, with flags of its own: an inherited -mod=vendor
	// or GOWORK would refuse a pkg@version install.
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-mod=mod -trimpath", "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if !complete(tmp) {
		return "", fmt.Errorf("go install of the reference plugins %s left some out", ReferenceVersion)
	}
	// Into place in one rename, so that a concurrent or interrupted run
	// never sees half a directory.
	if err := os.Rename(tmp, dir); err != nil && !complete(dir) {
		return "", err
	}
	return dir, nil
}
