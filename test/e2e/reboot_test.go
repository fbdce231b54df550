//go:build kernel

package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/test/harness"
)

// rebootRun is the directory a reboot empties (tmpfs on a node).
const rebootRun = "/run/meshwire"

// TestNodeReboot simulates a node reboot: the node is a network namespace
// of its own, where the plugins run and the bridge, host ends, routes and
// rules live; a reboot removes it and the pods' namespaces, empties
// /run/meshwire and keeps the host-local store (/var/lib/cni on a node).
// After it, the first ADD works, GC with the pods that exist now releases
// every address of the pods of the old boot, and the new boot's rules are
// the new pod's only.
func TestNodeReboot(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	// /run/meshwire of this boot: moved aside, given back at the end.
	saved := fmt.Sprintf("%s.mwt-reboot-%d", rebootRun, os.Getpid())
	if err := os.Rename(rebootRun, saved); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.RemoveAll(rebootRun)
		_ = os.Rename(saved, rebootRun)
	})
	emptyRun := func() {
		t.Helper()
		if err := os.RemoveAll(rebootRun); err != nil {
			t.Fatal(err)
		}
	}
	dataDir := t.TempDir()
	list := h.ConfList(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwt-reboot","plugins":[
		{"type":"bridge","bridge":"mwtreboot0","isGateway":true,"ipMasq":true,
		 "ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.57.0/24"}]]}},
		{"type":"portmap","capabilities":{"portMappings":true}}]}`, dataDir))
	caps := func(port int) map[string]any {
		return map[string]any{"portMappings": []map[string]any{{"hostPort": port, "containerPort": 80, "protocol": "tcp"}}}
	}
	// in runs fn with the plugins started in the node's namespace.
	in := func(node *harness.NS, fn func() error) {
		t.Helper()
		if err := node.Do(fn); err != nil {
			t.Fatal(err)
		}
	}
	rules := func(node *harness.NS) string {
		t.Helper()
		var b strings.Builder
		for _, tool := range []string{"iptables-save", "ip6tables-save", "nft -s list ruleset"} {
			f := strings.Fields(tool)
			out, err := node.Exec(f[0], f[1:]...)
			if err != nil {
				t.Fatalf("%s: %v: %s", tool, err, out)
			}
			b.WriteString(out)
		}
		return b.String()
	}

	node := h.NewNS("node")
	var old, gone []string
	for i := 0; i < 3; i++ {
		pod := h.NewNS("pod")
		a := h.Attach(list, pod, "eth0", caps(34000+i))
		in(node, func() error { _, err := a.Add(); return err })
		old, gone = append(old, a.RT.ContainerID), append(gone, pod.Name)
	}
	if n := harness.Reservations(t, dataDir, "mwt-reboot"); n != 3 {
		t.Fatalf("%d addresses reserved before the reboot, want 3", n)
	}

	// The reboot: every namespace and what is in it gone, /run emptied.
	for _, name := range append(gone, node.Name) {
		if err := netns.Delete(name); err != nil {
			t.Fatal(err)
		}
	}
	emptyRun()

	node = h.NewNS("node")
	pod := h.NewNS("pod")
	a := h.Attach(list, pod, "eth0", caps(34100))
	in(node, func() error { _, err := a.Add(); return err })
	in(node, func() error { return a.Check() })
	if n := harness.Reservations(t, dataDir, "mwt-reboot"); n != 4 {
		t.Fatalf("%d addresses reserved after the first ADD of the new boot, want 3 old and 1 new", n)
	}
	in(node, func() error { return h.GC(list, a.GCAttachment()) })
	if n := harness.Reservations(t, dataDir, "mwt-reboot"); n != 1 {
		t.Fatalf("%d addresses reserved after GC, want the new pod's only", n)
	}
	r := rules(node)
	for _, id := range old {
		if strings.Contains(r, id[:12]) {
			t.Fatalf("a rule of the old boot's pod %s:\n%s", id, r)
		}
	}
	if !strings.Contains(r, a.RT.ContainerID[:12]) && !strings.Contains(r, "34100") {
		t.Fatalf("the new pod's rules are not there:\n%s", r)
	}
	in(node, func() error { return a.Del() })
	if n := harness.Reservations(t, dataDir, "mwt-reboot"); n != 0 {
		t.Fatalf("%d addresses reserved after the last DEL", n)
	}
}
