//go:build kernel

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshwire/meshwire/ebpf/capture"
	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/installer"
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

// buildImage builds meshwire's image the way `make image` does, for the
// test, and returns its name.
func buildImage(t *testing.T, h *harness.H) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command(filepath.Join(root, "conf/kubernetes/rootfs.sh"), h.BinDir, rootfs).CombinedOutput(); err != nil {
		t.Fatalf("rootfs.sh: %v\n%s", err, out)
	}
	image := fmt.Sprintf("localhost/meshwire-test:%d-%s", os.Getpid(), strings.ToLower(t.Name()))
	if out, err := podman("build", "--quiet", "-f", filepath.Join(root, "conf/kubernetes/Containerfile"), "-t", image, rootfs); err != nil {
		t.Fatalf("podman build: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = podman("rmi", "--force", image) })
	return image
}

// TestImageInitContainer builds meshwire's image the way `make image` does
// (a root file system from this machine's Debian packages, no registry) and
// runs its iptables-init as a pod's init container runs: in the pod's
// network namespace, with NET_ADMIN and NET_RAW only, with the flag line
// Istio's injector passes; the rules must be there, for iptables-nft,
// iptables-legacy and nftables.
func TestImageInitContainer(t *testing.T) {
	h := harness.New(t)
	image := buildImage(t, h)
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

// TestImageNodeAgent runs the image's `meshwire node` as the DaemonSet's
// container: privileged, host network, the host's CNI directories, bpffs
// (shared) and cgroup hierarchy mounted where the manifest mounts them, the
// manifest's flags. The pins it makes are the host's, so the host's
// `meshwire fastpath` sees the fast path attached, and a detach on the host
// is undone by the agent; `podman stop` (SIGTERM) exits 0 with the config
// restored and the fast path detached.
func TestImageNodeAgent(t *testing.T) {
	h := harness.New(t)
	if st := fastpathStatus(t, h); st.Attached {
		t.Fatalf("the fast path is attached before the test (%s)", st.PinDir)
	}
	if err := loader.Supported(); err != nil { // mounts the host's bpffs
		t.Fatal(err)
	}
	cgroup, err := loader.Cgroup2Root()
	if err != nil {
		t.Fatal(err)
	}
	image := buildImage(t, h)
	n := newAgentNode(t)
	binDir, confDir, conf, orig, addr := n.binDir, n.confDir, n.conf, n.orig, n.addr
	logDir := t.TempDir()
	name := fmt.Sprintf("mwt-node-%d", os.Getpid())
	out, err := podman("run", "-d", "--name", name, "--privileged", "--network", "host",
		"-v", binDir+":/host/opt/cni/bin", "-v", confDir+":/host/etc/cni/net.d", "-v", logDir+":/var/log/meshwire",
		"-v", "/sys/fs/bpf:/sys/fs/bpf:rshared", "-v", filepath.Dir(cgroup)+":/host/sys/fs/cgroup:ro",
		image, "meshwire", "node", "--cni-bin-dir=/host/opt/cni/bin", "--cni-conf-dir=/host/etc/cni/net.d", "--chain", "--cleanup-on-exit",
		"--fastpath", "--cgroup=/host/sys/fs/cgroup", "--plugin-log=/var/log/meshwire/cni.log", "--listen="+addr, "--interval=200ms")
	if err != nil {
		t.Fatalf("podman run: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_, _ = podman("rm", "--force", name)
		// The agent may have attached the ebpf interception programs
		// again between a detach's two halves: detach whatever is left.
		if fastpath.IsAttached(fastpath.DefaultPinDir) || capture.IsAttached("") {
			fastpathDetach(t, h)
		}
	})
	logs := func() string { out, _ := podman("logs", name); return out }
	waitUntil(t, 20*time.Second, "the agent in its container ready", func() bool { return probeCode(addr, "/readyz") == 200 })
	// Attached at the host's cgroup v2 root, through the mounted
	// hierarchy (its id is the root directory's inode number).
	st := fastpathStatus(t, h)
	var root syscall.Stat_t
	if err := syscall.Stat(cgroup, &root); err != nil {
		t.Fatal(err)
	}
	if !st.Attached || st.CgroupID != root.Ino {
		t.Fatalf("the host sees %+v; want attached at cgroup %d (%s):\n%s", st, root.Ino, cgroup, logs())
	}
	if b, _ := os.ReadFile(conf); !installer.HasMarker(b) {
		t.Fatalf("config not chained:\n%s\n%s", b, logs())
	}
	if _, err := os.Stat(filepath.Join(binDir, "intercept")); err != nil {
		t.Fatalf("plugins not installed: %v", err)
	}

	// A detach on the host, under the same lock: the agent attaches again.
	fastpathDetach(t, h)
	waitUntil(t, 5*time.Second, "the fast path attached again by the agent", func() bool { return scrape(t, addr)["meshwire_fastpath_attaches_total"] == 2 })
	if !fastpath.IsAttached(fastpath.DefaultPinDir) {
		t.Fatal("the host does not see the fast path attached again")
	}

	if out, err := podman("stop", "--time", "10", name); err != nil {
		t.Fatalf("podman stop: %v\n%s", err, out)
	}
	if out, err := podman("inspect", "--format", "{{.State.ExitCode}}", name); err != nil || strings.TrimSpace(out) != "0" {
		t.Fatalf("the agent's exit code after SIGTERM: %q (%v)\n%s", out, err, logs())
	}
	if fastpath.IsAttached(fastpath.DefaultPinDir) {
		t.Fatalf("the fast path is still attached after the container stopped:\n%s", logs())
	}
	if b, _ := os.ReadFile(conf); !bytes.Equal(b, orig) {
		t.Fatalf("config not restored:\n%s\n%s", b, logs())
	}
	t.Logf("the agent's log:\n%s", logs())
}
