//go:build kernel

package e2e

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/nodeagent"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podproc/podproctest"
	"github.com/meshwire/meshwire/internal/podstate"
	"github.com/meshwire/meshwire/test/harness"
)

// TestAmbientAdoptsRunningPod: a pod that was running before ambient mode
// was on has no record (its ADD wrote none). When the API server shows it
// enrolled, the agent finds its namespace and sandbox through its
// processes (its container's, by the id in the pod's status), records it as the plugin would have, and enrolls it: Istio's
// in-pod rules in its namespace. The pod's DEL (its record removed, the
// namespace still there) unenrolls it; the agent's stop leaves nothing on
// the host.
func TestAmbientAdoptsRunningPod(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	const uid, node = "5e0c7f0a-1b2c-4d3e-8f40-123456789abc", "node-a"
	pod := h.NewNS("adopt")
	root, err := loader.Cgroup2Root()
	if err != nil {
		t.Fatal(err)
	}
	cg := podproctest.New(t, root)
	// As kubelet with cgroupsPerQOS false runs them (the project's
	// cluster): no pod cgroup, each container's own under containerd's.
	sandbox := cg.Start("", "sandbox42", pod.Path)
	app := cg.Start("", "app43", pod.Path)
	api := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{ambient.LabelDataplaneMode: ambient.DataplaneModeAmbient}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: types.UID(uid)},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "web"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "198.18.70.5", PodIPs: []corev1.PodIP{{IP: "198.18.70.5"}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: "web", ContainerID: "containerd://app43"}}}},
	)
	dir := t.TempDir()
	store := podstate.New(nodelayout.At(dir))
	x, err := nodeagent.StartAmbient(context.Background(), nodeagent.AmbientOptions{
		Config:        ambient.Config{RedirectDNS: true},
		Backend:       firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT},
		ZtunnelSocket: filepath.Join(dir, "ztunnel.sock"), StateDir: dir,
		API: true, Client: api, NodeName: node,
	}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_, _ = x.Stop()
		}
	})
	waitUntil(t, 10*time.Second, "the running pod enrolled", func() bool { return x.Enrolled() == 1 })
	rec, ok, err := store.Read(podstate.Name("sandbox42", "eth0"))
	if err != nil || !ok {
		t.Fatalf("no record named after the sandbox: %v", err)
	}
	if rec.UID != uid || rec.Key() != "shop/web" || len(rec.IPs) != 1 || rec.IPs[0] != netip.MustParseAddr("198.18.70.5") || rec.Check() != nil {
		t.Fatalf("record %+v", rec)
	}
	if rules := pod.IPTablesSave("iptables-nft-save", "nat"); !strings.Contains(rules, "-A OUTPUT -j "+ambient.ChainOutput) {
		t.Fatalf("the pod's nat table holds no ambient rules:\n%s", rules)
	}
	// The pod's DEL, as the runtime runs it: its processes are stopped,
	// then the plugin removes its record; the namespace stays (the
	// runtime removes it after).
	app.Kill()
	sandbox.Kill()
	if err := store.Remove(podstate.Name("sandbox42", "eth0")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the pod unenrolled", func() bool { return x.Enrolled() == 0 })
	if rules := pod.IPTablesSave("iptables-nft-save", "nat"); strings.Contains(rules, ambient.ChainOutput) {
		t.Fatalf("the pod's rules stayed:\n%s", rules)
	}
	stopped = true
	if removed, err := x.Stop(); err != nil || !removed {
		t.Fatalf("stop: host rule removed %v, %v", removed, err)
	}
}
