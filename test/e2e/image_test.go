//go:build kernel

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/test/harness"
)

// podman runs podman as ENVIRONMENT.md says it works on these machines
// (runc: crun refuses the hybrid cgroup layout; bounded ulimits).
func podman(args ...string) (string, error) {
	if len(args) > 0 && args[0] == "run" {
		args = append([]string{"run", "--runtime", "/usr/sbin/runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}, args[1:]...)
	}
	out, err := exec.Command("podman", args...).CombinedOutput()
	return string(out), err
}

// TestImageInitContainer builds meshwire's image the way `make image` does
// (a root file system from this machine's Debian packages, no registry) and
// runs its iptables-init as a pod's init container runs: in the pod's
// network namespace, with NET_ADMIN and NET_RAW only, with the flag line
// Istio's injector passes; the rules must be there, for iptables-nft,
// iptables-legacy and nftables.
func TestImageInitContainer(t *testing.T) {
	h := harness.New(t)
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command(filepath.Join(root, "conf/kubernetes/rootfs.sh"), h.BinDir, rootfs).CombinedOutput(); err != nil {
		t.Fatalf("rootfs.sh: %v\n%s", err, out)
	}
	image := fmt.Sprintf("localhost/meshwire-test:%d", os.Getpid())
	if out, err := podman("build", "--quiet", "-f", filepath.Join(root, "conf/kubernetes/Containerfile"), "-t", image, rootfs); err != nil {
		t.Fatalf("podman build: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = podman("rmi", "--force", image) })
	for _, tc := range []struct {
		name, backendFlag, dump string
		want                    string
	}{
		{"iptables-nft", "", "iptables-nft-save -t nat", "-A ISTIO_OUTPUT"},
		{"iptables-legacy", "--iptables-backend=legacy", "iptables-legacy-save -t nat", "-A ISTIO_OUTPUT"},
		{"nftables", "--native-nftables", "nft list ruleset", "chain "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := h.NewNS("mwimg")
			args := []string{"run", "--rm", "--network", "ns:" + pod.Path, "--cap-drop", "all", "--cap-add", "NET_ADMIN,NET_RAW",
				image, "iptables-init", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--log_output_level=default:info"}
			if tc.backendFlag != "" {
				args = append(args, tc.backendFlag)
			}
			if out, err := podman(args...); err != nil {
				t.Fatalf("the image's iptables-init: %v\n%s", err, out)
			}
			f := strings.Fields(tc.dump)
			out, err := pod.Exec(f[0], f[1:]...)
			if err != nil || !strings.Contains(out, tc.want) || !strings.Contains(out, "15001") {
				t.Fatalf("%s in the pod: %v\n%s", tc.dump, err, out)
			}
			// Without NET_ADMIN it must fail, not half-install.
			noCap := []string{"run", "--rm", "--network", "ns:" + pod.Path, "--cap-drop", "all", image, "iptables-init", "--cleanup-only"}
			if out, err := podman(noCap...); err == nil {
				t.Fatalf("iptables-init without NET_ADMIN succeeded:\n%s", out)
			}
		})
	}
}
