//go:build kernel

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/test/harness"
)

// Addresses of the veth tests: 198.18.24.0/21 of the 198.18.16.0/20 range,
// fd20:0:0:24::/64 and up; host veths mwtb*.

// vethList renders a veth plugin conflist with host-local over subnets.
func (e *bridgeEnv) vethList(cniVersion, name string, opts map[string]any, subnets ...string) *libcni.NetworkConfigList {
	return e.h.Single(cniVersion, name, e.render("veth", opts, subnets...))
}

// TestVethEveryVersion: the life cycle with each spec version, dual stack,
// with the point-to-point addressing of the reference ptp plugin.
func TestVethEveryVersion(t *testing.T) {
	e := newBridgeEnv(t)
	for i, v := range version.All.SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			ns := e.h.NewNS("veth")
			list := e.vethList(v, fmt.Sprintf("mwtb-vver%d", i), map[string]any{"ipam": map[string]any{
				"type": "host-local", "dataDir": e.dataDir,
				"ranges": [][]map[string]string{{{"subnet": "198.18.24.0/24"}}, {{"subnet": "fd20:0:0:24::/64"}}},
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
			}}, "unused")
			a := e.h.Attach(list, ns, "eth0", nil)
			cr := bridgeAddVersion(t, a, v)
			v4, v6 := bridgeIPs(t, cr)
			hostName := bridgeHostVeth(a)
			if gte(v, "0.3.0") {
				if v6 == nil {
					t.Fatalf("result lacks IPv6: %+v", cr)
				}
				if len(cr.Interfaces) != 2 || cr.Interfaces[0].Name != hostName || cr.Interfaces[1].Name != "eth0" || cr.Interfaces[1].Sandbox != ns.Path {
					t.Fatalf("interfaces %+v, want host veth %s and eth0 in the sandbox", cr.Interfaces, hostName)
				}
			}
			if !slices.Contains(ns.Addrs("eth0"), v4.String()+"/24") {
				t.Fatalf("eth0 addresses %v lack %s/24", ns.Addrs("eth0"), v4)
			}
			host := bridgeHostLink(t, hostName)
			if host.Attrs().MasterIndex != 0 {
				t.Fatalf("%s has a master: the veth plugin uses no bridge", hostName)
			}
			// The gateway is the host end, reached on-link; the pod's own
			// subnet goes through it too (no prefix route on eth0).
			bridgeMustPing(t, ns, "198.18.24.1")
			routes := ns.Routes(0)
			for _, r := range routes {
				if r.Dst != nil && r.Dst.String() == "198.18.24.0/24" && r.Gw == nil {
					t.Fatalf("eth0 has a prefix route %v; the subnet must go through the gateway", r)
				}
			}
			if gte(v, "0.3.0") {
				bridgeMustPing(t, ns, "fd20:0:0:24::1")
			}
			bridgeLifecycleEnd(t, e, v, list, a, ns, "198.18.24.1")
		})
	}
}

// TestVethConnectivity: pod to its gateway (the host end), pod to pod through
// the host's routes, pod to a host address, and pod to the outside through
// masquerade, dual stack; MTU on both ends; DEL removes the host routes.
func TestVethConnectivity(t *testing.T) {
	e := newBridgeEnv(t)
	out4, out6 := bridgeInternet(t, e.h)
	list := e.vethList("1.0.0", "mwtb-vconn", map[string]any{"ipMasq": true, "mtu": 1400, "ipam": map[string]any{
		"type": "host-local", "dataDir": e.dataDir,
		"ranges": [][]map[string]string{{{"subnet": "198.18.27.0/24"}}, {{"subnet": "fd20:0:0:27::/64"}}},
		"routes": []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
	}})
	nsA, nsB := e.h.NewNS("veth"), e.h.NewNS("veth")
	a, b := e.h.Attach(list, nsA, "eth0", nil), e.h.Attach(list, nsB, "eth0", nil)
	a.MustAdd()
	rb := b.MustAdd()
	b4, b6 := bridgeIPs(t, rb)
	bridgeMustPing(t, nsA, "198.18.27.1")
	bridgeMustPing(t, nsA, b4.String())
	bridgeMustPing(t, nsA, b6.String())
	bridgeMustPing(t, nsA, "198.18.31.1")
	bridgeMustPing(t, nsA, out4)
	bridgeMustPing(t, nsB, out6)
	if m := nsA.Link("eth0").Attrs().MTU; m != 1400 {
		t.Fatalf("eth0 MTU %d", m)
	}
	if m := bridgeHostLink(t, bridgeHostVeth(a)).Attrs().MTU; m != 1400 {
		t.Fatalf("host end MTU %d", m)
	}
	if err := b.Check(); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := b.Del(); err != nil {
		t.Fatal(err)
	}
	routes, err := netlink.RouteGet(b4)
	if err == nil && len(routes) > 0 && routes[0].LinkIndex != 0 {
		if l, err := netlink.LinkByIndex(routes[0].LinkIndex); err == nil && l.Attrs().Name == bridgeHostVeth(b) {
			t.Fatal("host route to the deleted pod left")
		}
	}
	if bridgeMasqInstalled(t, "mwtb-vconn", b) {
		t.Fatal("masquerade left after DEL")
	}
	bridgeMustPing(t, nsA, out4)
}

// TestVethInstalledAsPtp: `make install` puts the plugin in the CNI bin
// directory under the reference's name too, and a config written for the
// reference ptp (`"type": "ptp"`, no meshwire key) runs through libcni with
// that binary: ADD, connectivity, CHECK, DEL.
func TestVethInstalledAsPtp(t *testing.T) {
	bin := harness.BinDir(t)
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	// -o build: install the binaries this test run uses, without a rebuild.
	cmd := exec.Command("make", "--no-print-directory", "-o", "build", "install", "BIN="+bin, "DESTDIR="+dest)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	cniDir := filepath.Join(dest, "opt", "cni", "bin")
	want, err := os.ReadFile(filepath.Join(bin, "veth"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"veth", "ptp"} {
		p := filepath.Join(cniDir, name)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("make install: %v", err)
		}
		if fi.Mode().Perm()&0o111 != 0o111 {
			t.Fatalf("%s is not executable: %v", p, fi.Mode())
		}
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s is not the veth plugin built in %s (%v)", p, bin, err)
		}
	}

	// Only the installed directory holds a ptp: libcni runs that binary.
	e := newBridgeEnv(t, cniDir)
	ns := e.h.NewNS("veth")
	list := e.h.ConfList(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"mwtb-ptp","plugins":[{
		"type":"ptp","ipMasq":true,"mtu":1400,
		"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.28.0/24"}],[{"subnet":"fd20:0:0:28::/64"}]],
			"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]},
		"dns":{"nameservers":["198.18.28.1"]}}]}`, e.dataDir))
	a := e.h.Attach(list, ns, "eth0", nil)
	r := a.MustAdd()
	if len(r.Interfaces) != 2 || r.Interfaces[1].Name != "eth0" || r.Interfaces[1].Sandbox != ns.Path {
		t.Fatalf("result interfaces %+v, want the host veth and eth0 in the sandbox", r.Interfaces)
	}
	if len(r.DNS.Nameservers) != 1 || r.DNS.Nameservers[0] != "198.18.28.1" {
		t.Fatalf("result DNS %+v, want the config's", r.DNS)
	}
	v4, v6 := bridgeIPs(t, r)
	if v4 == nil || v6 == nil {
		t.Fatalf("result %+v lacks an address of each family", r.IPs)
	}
	if l := ns.Link("eth0"); l.Attrs().MTU != 1400 {
		t.Fatalf("eth0 MTU %d, want 1400", l.Attrs().MTU)
	}
	bridgeMustPing(t, ns, "198.18.28.1")
	bridgeMustPing(t, ns, "fd20:0:0:28::1")
	if err := a.Check(); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	host := r.Interfaces[0].Name
	if err := a.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if bridgeHasHostLink(host) {
		t.Fatalf("host veth %s left after DEL", host)
	}
}
