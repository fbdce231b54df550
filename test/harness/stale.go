package harness

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/internal/netns"
)

// RemoveStale removes what a test or benchmark process killed mid-run
// (Ctrl-C, a timeout) left that would stop or skew the next run: the
// harness's namespaces (mwt-*) and an attached fast path (with the ebpf
// interception programs), detached forced through the built meshwire in
// binDir. Call it holding the node-wide test lock (kerneltest.Lock), before
// any test of the process starts, so that nothing it removes is in use.
// It returns what it removed.
func RemoveStale(binDir string) ([]string, error) {
	var removed []string
	names, err := netns.List()
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if strings.HasPrefix(n, "mwt-") {
			if err := netns.Delete(n); err != nil {
				return removed, fmt.Errorf("remove the stale namespace %s: %w", n, err)
			}
			removed = append(removed, "netns "+n)
		}
	}
	if fastpath.IsAttached(fastpath.DefaultPinDir) {
		out, err := exec.Command(filepath.Join(binDir, "meshwire"), "fastpath", "detach", "--force").CombinedOutput()
		if err != nil {
			return removed, fmt.Errorf("detach the stale fast path: %v: %s", err, out)
		}
		removed = append(removed, "the fast path attached at "+fastpath.DefaultPinDir)
	}
	return removed, nil
}
