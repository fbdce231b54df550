package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/link"
	"github.com/meshwire/meshwire/test/harness"
)

// Addresses and names of the bridge tests: 198.18.16.0/20 and fd20::/16,
// bridges named mwt-br*, host veths mwtb*.

// bridgeEnv is one test's bridge and IPAM store.
type bridgeEnv struct {
	h       *harness.H
	br      string
	dataDir string
}

// newBridgeEnv prepares a bridge name and an IPAM store, checks the host for
// leaks, and removes the bridge (which, like the reference's cni0, outlives
// its pods) after the test but before the leak check.
func newBridgeEnv(t *testing.T, extraPath ...string) *bridgeEnv {
	h := harness.New(t, extraPath...)
	bridgeFirewallBaseline(t)
	e := &bridgeEnv{h: h, br: "mwt-br" + harness.RandomID()[:4], dataDir: t.TempDir()}
	h.CheckNoLeaks()
	t.Cleanup(func() { bridgeRemoveLinks(e.br) })
	return e
}

// bridgeFirewallBaseline puts the node-level state the plugins set up once
// per node in place before the leak snapshot, as it would be on any node
// running pods: the iptables nat tables (created on first use, they stay) and
// IP forwarding (enabling IPv6 forwarding adds anycast routes).
func bridgeFirewallBaseline(t *testing.T) {
	for _, key := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(key, []byte("1"), 0o644); err != nil {
			t.Fatalf("enable forwarding: %v", err)
		}
	}
	for _, tool := range []string{"iptables-restore", "ip6tables-restore"} {
		cmd := exec.Command(tool, "--noflush", "-w", "10")
		cmd.Stdin = strings.NewReader("*nat\nCOMMIT\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", tool, err, out)
		}
	}
}

// bridgeRemoveLinks deletes the test bridge and its VLAN gateway links.
func bridgeRemoveLinks(br string) {
	links, _ := netlink.LinkList()
	for _, l := range links {
		n := l.Attrs().Name
		if n == br || strings.HasPrefix(n, br+".") {
			_ = netlink.LinkDel(l)
		}
	}
	links, _ = netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "mwtb") {
			if _, ok := l.(*netlink.Veth); ok && l.Attrs().MasterIndex == 0 && l.Attrs().ParentIndex != 0 {
				if peer, err := netlink.LinkByIndex(l.Attrs().ParentIndex); err == nil && strings.HasPrefix(peer.Attrs().Name, br+".") {
					_ = netlink.LinkDel(l)
				}
			}
		}
	}
}

// plugin renders a bridge plugin config: host-local over subnets, with opts
// added (a nil value removes a key).
func (e *bridgeEnv) plugin(opts map[string]any, subnets ...string) string {
	var ranges [][]map[string]string
	for _, s := range subnets {
		ranges = append(ranges, []map[string]string{{"subnet": s}})
	}
	c := map[string]any{
		"type":           "bridge",
		"bridge":         e.br,
		"hostVethPrefix": "mwtb",
		"ipam":           map[string]any{"type": "host-local", "dataDir": e.dataDir, "ranges": ranges},
	}
	for k, v := range opts {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	b, _ := json.Marshal(c)
	return string(b)
}

func (e *bridgeEnv) list(version, name string, opts map[string]any, subnets ...string) *libcni.NetworkConfigList {
	return e.h.Single(version, name, e.plugin(opts, subnets...))
}

// bridgeIPs returns the result's addresses by family.
func bridgeIPs(t *testing.T, r *current.Result) (v4, v6 net.IP) {
	t.Helper()
	for _, ip := range r.IPs {
		if ip.Address.IP.To4() != nil {
			v4 = ip.Address.IP
		} else {
			v6 = ip.Address.IP
		}
	}
	return v4, v6
}

func bridgeMustPing(t *testing.T, ns *harness.NS, ip string) {
	t.Helper()
	if _, err := probePing(ns.Path, ip); err != nil {
		t.Fatalf("ping %s from %s: %v", ip, ns.Name, err)
	}
}

func bridgeHostVeth(a *harness.Attachment) string {
	return link.HostVethName("mwtb", a.RT.ContainerID, a.RT.IfName)
}

func bridgeHostLink(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("host link %s: %v", name, err)
	}
	return l
}

func bridgeHasHostLink(name string) bool {
	_, err := netlink.LinkByName(name)
	return err == nil
}

// TestBridgeEveryVersion runs ADD, CHECK, STATUS, GC and DEL (twice) with
// each spec version, dual stack, and checks the result's shape and what the
// kernel shows.
func TestBridgeEveryVersion(t *testing.T) {
	e := newBridgeEnv(t)
	for i, v := range version.All.SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			ns := e.h.NewNS("br")
			list := e.list(v, fmt.Sprintf("mwtb-ver%d", i), map[string]any{"isDefaultGateway": true}, "198.18.16.0/24", "fd20:0:0:16::/64")
			a := e.h.Attach(list, ns, "eth0", nil)
			res, err := a.Add()
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != v {
				t.Fatalf("result version %s, want %s", res.Version(), v)
			}
			cr, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			v4, v6 := bridgeIPs(t, cr)
			if v4 == nil {
				t.Fatalf("result lacks an IPv4 address: %+v", cr)
			}
			hostName := bridgeHostVeth(a)
			if gte(v, "0.3.0") {
				if v6 == nil {
					t.Fatalf("result lacks an IPv6 address: %+v", cr)
				}
				if len(cr.Interfaces) != 3 || cr.Interfaces[0].Name != e.br || cr.Interfaces[1].Name != hostName ||
					cr.Interfaces[2].Name != "eth0" || cr.Interfaces[2].Sandbox != ns.Path {
					t.Fatalf("interfaces %+v, want bridge, host veth %s, eth0 in sandbox", cr.Interfaces, hostName)
				}
				for _, ip := range cr.IPs {
					if ip.Interface == nil || *ip.Interface != 2 {
						t.Fatalf("IP %s does not point at the container interface", ip.Address.String())
					}
				}
				if cr.Interfaces[2].Mac != ns.Link("eth0").Attrs().HardwareAddr.String() {
					t.Fatalf("container MAC %s in result, kernel says %s", cr.Interfaces[2].Mac, ns.Link("eth0").Attrs().HardwareAddr)
				}
			}
			if !contains(ns.Addrs("eth0"), v4.String()+"/24") {
				t.Fatalf("eth0 addresses %v lack %s/24", ns.Addrs("eth0"), v4)
			}
			if bridgeHostLink(t, hostName).Attrs().MasterIndex != bridgeHostLink(t, e.br).Attrs().Index {
				t.Fatalf("%s is not a port of %s", hostName, e.br)
			}
			bridgeMustPing(t, ns, "198.18.16.1")
			if gte(v, "0.3.0") {
				bridgeMustPing(t, ns, "fd20:0:0:16::1")
			}
			if gte(v, "0.4.0") {
				if err := a.Check(); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}
			if gte(v, "1.1.0") {
				if err := e.h.Status(list); err != nil {
					t.Fatalf("STATUS: %v", err)
				}
				if err := e.h.GC(list, a.GCAttachment()); err != nil {
					t.Fatalf("GC: %v", err)
				}
				bridgeMustPing(t, ns, "198.18.16.1")
			}
			if err := a.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if bridgeHasHostLink(hostName) || ns.HasLink("eth0") {
				t.Fatal("veth pair still there after DEL")
			}
			if err := a.Del(); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
		})
	}
}
