//go:build kernel

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/meshwire/meshwire/internal/installer"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/test/cri"
	"github.com/meshwire/meshwire/test/harness"
)

// TestCRIContainerdKilled kills containerd with SIGKILL while pods are
// being created and removed through its CRI (bridge with host-local,
// portmap, bandwidth and intercept chained as `meshwire install --chain`
// writes them), several times, starting it again each time. Then, as
// kubelet does, it removes every pod containerd knows. Whatever the plugins
// were doing when containerd died, what containerd then runs leaves nothing
// behind: no veth, ifb, rule, address reservation or network namespace of
// the pods.
func TestCRIContainerdKilled(t *testing.T) {
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	before := map[string]bool{}
	if entries, err := os.ReadDir("/var/run/netns"); err == nil {
		for _, e := range entries {
			before[e.Name()] = true
		}
	}
	c, dataDir := criKillContainerd(t, h)

	const workers, kills = 6, 3
	var created, removed, failed int
	var mu sync.Mutex
	for k := 0; k < kills; k++ {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					spec := cri.PodSpec{Name: fmt.Sprintf("p%d-%d-%d", k, w, i), Namespace: "chaos",
						PortMappings: []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 80, HostPort: int32(35000 + 100*k + 10*w + i%10)}},
						Annotations:  map[string]string{"kubernetes.io/egress-bandwidth": "20M"}}
					if w%2 == 0 {
						spec.Annotations["sidecar.istio.io/status"] = `{"initContainers":["istio-validation"],"containers":["istio-proxy"]}`
					}
					p, err := c.RunPodE(spec)
					mu.Lock()
					if err != nil {
						failed++
					} else {
						created++
					}
					mu.Unlock()
					if err != nil {
						time.Sleep(20 * time.Millisecond) // containerd is down
						continue
					}
					if p.Remove() == nil {
						mu.Lock()
						removed++
						mu.Unlock()
					}
				}
			}(w)
		}
		time.Sleep(time.Duration(700+300*k) * time.Millisecond)
		if err := c.KillAndRestart(); err != nil {
			t.Fatalf("kill %d: %v", k, err)
		}
		close(stop)
		wg.Wait()
	}
	t.Logf("containerd killed %d times; pods created %d, removed %d, failed %d", kills, created, removed, failed)

	// What kubelet does with a restarted runtime: every pod it does not
	// want (here, all) stopped and removed.
	if err := c.RemoveAllPods(); err != nil {
		t.Fatalf("removing the pods containerd knows: %v", err)
	}
	// Plugins started by the killed containerd may still be finishing.
	waitNoPlugins(t, h.BinDir)
	if n := harness.Reservations(t, dataDir, "mwt-crikill"); n != 0 {
		t.Errorf("%d addresses still reserved after containerd removed every pod it knows", n)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, "mwck") || l.Type() == "ifb" && strings.HasPrefix(n, "mwbw") {
			t.Errorf("%s left on the host", n)
		}
	}
	// containerd 1.6 killed inside RunPodSandbox may lose track of the
	// namespace it had just made: nothing of meshwire's may be in it (no
	// interface but lo: the pod's veth would mean an ADD containerd never
	// undid). It is removed here, containerd's leak, not the plugins'.
	entries, _ := os.ReadDir("/var/run/netns")
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "cni-") || before[e.Name()] {
			continue
		}
		out, err := exec.Command("ip", "-n", e.Name(), "-o", "link").CombinedOutput()
		if err != nil && strings.Contains(string(out), "Invalid argument") {
			// Only the file: containerd was killed before it mounted
			// the namespace on it.
			t.Logf("%s: a namespace file containerd never mounted, removed", e.Name())
			if err := netns.DeletePath("/var/run/netns/" + e.Name()); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("ip -n %s link: %v: %s", e.Name(), err, out)
		}
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.Contains(lines[0], ": lo:") {
			t.Errorf("namespace %s containerd lost holds a pod's interfaces:\n%s", e.Name(), out)
		}
		t.Logf("namespace %s: made by containerd before it was killed, never recorded; empty, removed", e.Name())
		if err := netns.DeletePath("/var/run/netns/" + e.Name()); err != nil {
			t.Fatal(err)
		}
	}
}

// criKillContainerd starts containerd with bridge and host-local (under a
// fresh bridge and data directory, removed at cleanup), and portmap,
// bandwidth and intercept chained as `meshwire install --chain` writes
// them: network "mwt-crikill".
func criKillContainerd(t *testing.T, h *harness.H) (c *cri.Containerd, dataDir string) {
	br := "mwtk" + harness.RandomID()[:6]
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(br); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	dataDir = t.TempDir()
	chained, err := installer.Chain([]byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"mwt-crikill","plugins":[
		{"type":"bridge","bridge":%q,"isDefaultGateway":true,"hostVethPrefix":"mwck",
		 "ipam":{"type":"host-local","ranges":[[{"subnet":"198.18.58.0/24"}]],"dataDir":%q}}]}`, br, dataDir)))
	if err != nil {
		t.Fatal(err)
	}
	return cri.Start(t, cri.Config{BinDir: h.BinDir, ConfList: string(chained.Out)}), dataDir
}

// TestCRITruncatedResultCache: containerd 1.6 writes its cached CNI result
// in place, so a containerd killed during that write leaves the file
// truncated, and every StopPodSandbox of the pod then fails before any
// plugin runs (what TestCRIContainerdKilled meets when a kill lands
// there). The test client removes such a file (cri.Containerd.RemovePod)
// and containerd runs the DEL from the configuration, with no previous
// result: the plugins must still remove everything the ADD made. A meshed
// pod with a host port and a bandwidth annotation is set up, its cached
// result emptied, and the pod removed: no veth, ifb, rule, reservation or
// namespace stays.
func TestCRITruncatedResultCache(t *testing.T) {
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	c, dataDir := criKillContainerd(t, h)
	p := c.RunPod(cri.PodSpec{Name: "truncated", Namespace: "chaos",
		PortMappings: []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 80, HostPort: 35900}},
		Annotations: map[string]string{"kubernetes.io/egress-bandwidth": "20M",
			"sidecar.istio.io/status": `{"initContainers":["istio-validation"],"containers":["istio-proxy"]}`}})
	files, err := filepath.Glob("/var/lib/cni/results/mwt-crikill-" + p.ID + "-*")
	if err != nil || len(files) != 1 {
		t.Fatalf("containerd's cached result of pod %s: %v %v (want one file)", p.ID, files, err)
	}
	if err := os.Truncate(files[0], 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Remove(); err != nil {
		t.Fatalf("removing the pod with its cached result truncated: %v", err)
	}
	if _, err := os.Stat(files[0]); !os.IsNotExist(err) {
		t.Errorf("the truncated cached result %s is still there (%v)", files[0], err)
	}
	if n := harness.Reservations(t, dataDir, "mwt-crikill"); n != 0 {
		t.Errorf("%d addresses still reserved after the pod was removed", n)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, "mwck") || l.Type() == "ifb" && strings.HasPrefix(n, "mwbw") {
			t.Errorf("%s left on the host", n)
		}
	}
}

// waitNoPlugins waits until no process runs a binary of binDir.
func waitNoPlugins(t *testing.T, binDir string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out, _ := exec.Command("pgrep", "-f", binDir+"/").Output()
		if len(strings.TrimSpace(string(out))) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("plugins of %s still running after 30 s", binDir)
}
