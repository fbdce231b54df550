//go:build kernel

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/kerneltest"
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
	nodeBaseline(t)
	e := &bridgeEnv{h: h, br: "mwt-br" + harness.RandomID()[:4], dataDir: t.TempDir()}
	h.CheckNoLeaks()
	t.Cleanup(func() { bridgeRemoveLinks(e.br) })
	return e
}

// bridgeRemoveLinks deletes the test bridge and its VLAN gateway links.
func bridgeRemoveLinks(br string) {
	links, _ := netlinksafe.LinkList()
	for _, l := range links {
		n := l.Attrs().Name
		if n == br || strings.HasPrefix(n, br+".") {
			_ = netlink.LinkDel(l)
		}
	}
	links, _ = netlinksafe.LinkList()
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
	return e.render("bridge", opts, subnets...)
}

// render is a config of plugin kind (bridge or veth) on this test's bridge
// and IPAM store.
func (e *bridgeEnv) render(kind string, opts map[string]any, subnets ...string) string {
	var ranges [][]map[string]string
	for _, s := range subnets {
		ranges = append(ranges, []map[string]string{{"subnet": s}})
	}
	c := map[string]any{
		"type":           kind,
		"hostVethPrefix": "mwtb",
		"ipam":           map[string]any{"type": "host-local", "dataDir": e.dataDir, "ranges": ranges},
	}
	if kind == "bridge" {
		c["bridge"] = e.br
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

// bridgeMustPing pings ip from ns. An IPv6 address may still be tentative
// (duplicate address detection, on either end) or its neighbour not yet
// resolved when the first echo goes out: IPv6 pings go on until one is
// answered or 10 s have passed, where one 2 s ping was a known CI flake.
func bridgeMustPing(t *testing.T, ns *harness.NS, ip string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := probePing(ns.Path, ip)
		if err == nil {
			return
		}
		if net.ParseIP(ip).To4() != nil || time.Now().After(deadline) {
			t.Fatalf("ping %s from %s: %v", ip, ns.Name, err)
		}
	}
}

func bridgeHostVeth(a *harness.Attachment) string {
	return attachment.ID{ContainerID: a.RT.ContainerID, IfName: a.RT.IfName}.HostVeth("mwtb")
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

// bridgeAddVersion runs ADD and checks the result is in spec version v.
func bridgeAddVersion(t *testing.T, a *harness.Attachment, v string) *current.Result {
	t.Helper()
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
	return cr
}

// bridgeLifecycleEnd is the end of a life-cycle test for spec version v:
// CHECK (0.4.0 and later), STATUS and GC (1.1.0; the pod still reaches gw
// after GC), DEL, the veth pair gone, and a second DEL.
func bridgeLifecycleEnd(t *testing.T, e *bridgeEnv, v string, list *libcni.NetworkConfigList, a *harness.Attachment, ns *harness.NS, gw string) {
	t.Helper()
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
		bridgeMustPing(t, ns, gw)
	}
	if err := a.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if bridgeHasHostLink(bridgeHostVeth(a)) || ns.HasLink("eth0") {
		t.Fatal("veth pair still there after DEL")
	}
	if err := a.Del(); err != nil {
		t.Fatalf("second DEL: %v", err)
	}
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
			cr := bridgeAddVersion(t, a, v)
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
			if !slices.Contains(ns.Addrs("eth0"), v4.String()+"/24") {
				t.Fatalf("eth0 addresses %v lack %s/24", ns.Addrs("eth0"), v4)
			}
			if bridgeHostLink(t, hostName).Attrs().MasterIndex != bridgeHostLink(t, e.br).Attrs().Index {
				t.Fatalf("%s is not a port of %s", hostName, e.br)
			}
			bridgeMustPing(t, ns, "198.18.16.1")
			if gte(v, "0.3.0") {
				bridgeMustPing(t, ns, "fd20:0:0:16::1")
			}
			bridgeLifecycleEnd(t, e, v, list, a, ns, "198.18.16.1")
		})
	}
}

// bridgeInternet makes a namespace standing for the outside world, linked to
// the host by a veth pair: the host end has 198.18.31.1/30 and
// fd20:0:0:31::1/64, the far end .2 and ::2. The far side has no route back
// to any pod subnet, so only masqueraded traffic gets answers.
func bridgeInternet(t *testing.T, h *harness.H) (v4, v6 string) {
	t.Helper()
	h.NewOutside("inet", "mwtbi"+harness.RandomID()[:6],
		[]string{"198.18.31.1/30", "fd20:0:0:31::1/64"}, []string{"198.18.31.2/30", "fd20:0:0:31::2/64"})
	return "198.18.31.2", "fd20:0:0:31::2"
}

// bridgeMasqInstalled reports whether any masquerade chain or table of the
// attachment is on the host, in either backend.
func bridgeMasqInstalled(t *testing.T, network string, a *harness.Attachment) bool {
	t.Helper()
	m := attachment.ID{Network: network, ContainerID: a.RT.ContainerID, IfName: a.RT.IfName}
	for _, tool := range []string{"iptables-save", "ip6tables-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := exec.Command(tool, "-t", "nat").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", tool, err, out)
		}
		if strings.Contains(string(out), m.MasqTag()) {
			return true
		}
	}
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	return strings.Contains(string(out), m.MasqTable())
}

// bridgeMustNotPing fails when ip answers (used to prove masquerade is what
// makes the outside reachable).
func bridgeMustNotPing(t *testing.T, ns *harness.NS, ip string) {
	t.Helper()
	if _, err := probePing(ns.Path, ip); err == nil {
		t.Fatalf("%s answers from %s, want no answer", ip, ns.Name)
	}
}

// TestBridgeConnectivity: pod to gateway, pod to pod on the same bridge, pod
// to host, and pod to the outside through masquerade with both backends,
// dual stack; DEL removes the masquerade rules.
func TestBridgeConnectivity(t *testing.T) {
	// iptables is iptables-nft here (its rules are read and removed over
	// netlink); legacy keeps the tool path covered.
	// nftables with no tool: the plugin runs with a PATH holding no
	// firewall tool, as on a minimal node; ipMasq and macspoofchk go over
	// netlink.
	for _, c := range []struct {
		name, backend string
		i             int
		noTools       bool
	}{{"iptables", "iptables", 0, false}, {"nftables", "nftables", 1, false}, {"legacy", "legacy", 11, false}, {"nftables-no-tools", "nftables", 12, true}} {
		backend, i := c.backend, c.i
		t.Run(c.name, func(t *testing.T) {
			e := newBridgeEnv(t)
			out4, out6 := bridgeInternet(t, e.h)
			name := "mwtb-conn-" + c.name
			opts := map[string]any{"isDefaultGateway": true, "ipMasq": true, "ipMasqBackend": backend}
			if c.noTools {
				opts["macspoofchk"] = true
			}
			list := e.list("1.1.0", name, opts, fmt.Sprintf("198.18.%d.0/24", 17+i), fmt.Sprintf("fd20:0:0:%d::/64", 17+i))
			nsA, nsB := e.h.NewNS("br"), e.h.NewNS("br")
			a, b := e.h.Attach(list, nsA, "eth0", nil), e.h.Attach(list, nsB, "eth0", nil)
			plugin := func(fn func() error) error { return fn() }
			if c.noTools {
				plugin = func(fn func() error) error { return kerneltest.WithoutTools(t, fn) }
			}
			var ra, rb *current.Result
			if err := plugin(func() error { ra, rb = a.MustAdd(), b.MustAdd(); return e.h.Status(list) }); err != nil {
				t.Fatalf("STATUS: %v", err)
			}
			_, a6 := bridgeIPs(t, ra)
			b4, b6 := bridgeIPs(t, rb)
			if a6 == nil || b6 == nil {
				t.Fatal("no IPv6 address")
			}
			bridgeMustPing(t, nsA, fmt.Sprintf("198.18.%d.1", 17+i))
			bridgeMustPing(t, nsA, b4.String())
			bridgeMustPing(t, nsA, b6.String())
			bridgeMustPing(t, nsA, "198.18.31.1") // a host address
			bridgeMustPing(t, nsA, out4)
			bridgeMustPing(t, nsB, out6)
			if !bridgeMasqInstalled(t, name, a) {
				t.Fatal("no masquerade rules after ADD")
			}
			spoofTables := func() int {
				out, err := harness.Run("nft", "list", "tables", "bridge")
				if err != nil {
					t.Fatalf("nft list tables bridge: %v", err)
				}
				return strings.Count(out, "meshwire_macspoof")
			}
			if c.noTools && spoofTables() != 2 {
				t.Fatalf("%d macspoofchk tables after two ADDs with no tool, want 2", spoofTables())
			}
			if err := plugin(a.Check); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			if err := plugin(a.Del); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if bridgeMasqInstalled(t, name, a) {
				t.Fatal("masquerade rules left after DEL")
			}
			if c.noTools && spoofTables() != 1 {
				t.Fatalf("%d macspoofchk tables after one DEL, want 1", spoofTables())
			}
			bridgeMustPing(t, nsB, out4)
			if err := plugin(func() error { return e.h.GC(list) }); err != nil {
				t.Fatalf("GC: %v", err)
			}
			if bridgeMasqInstalled(t, name, b) {
				t.Fatal("masquerade rules of a pod GC was not told of left after GC")
			}
		})
	}
	t.Run("no-masquerade", func(t *testing.T) {
		e := newBridgeEnv(t)
		out4, _ := bridgeInternet(t, e.h)
		list := e.list("1.1.0", "mwtb-nomasq", map[string]any{"isDefaultGateway": true}, "198.18.19.0/24")
		ns := e.h.NewNS("br")
		e.h.Attach(list, ns, "eth0", nil).MustAdd()
		bridgeMustPing(t, ns, "198.18.19.1")
		bridgeMustNotPing(t, ns, out4)
	})
}

// bridgeOneAddr is a host-local config handing out exactly one address, so
// that a second ADD succeeds only when the first address was released.
func (e *bridgeEnv) bridgeOneAddr(subnet, addr string) map[string]any {
	return map[string]any{"type": "host-local", "dataDir": e.dataDir,
		"ranges": [][]map[string]string{{{"subnet": subnet, "rangeStart": addr, "rangeEnd": addr}}}}
}

// bridgeKindList is a conflist of the bridge or veth plugin ("kind").
func (e *bridgeEnv) bridgeKindList(kind, name string, opts map[string]any) *libcni.NetworkConfigList {
	if kind == "veth" {
		return e.vethList("1.1.0", name, opts)
	}
	return e.list("1.1.0", name, opts)
}

// bridgeRawConf is the plugin config as libcni would pass it (no prevResult).
func bridgeRawConf(list *libcni.NetworkConfigList) []byte {
	var m map[string]any
	_ = json.Unmarshal(list.Plugins[0].Bytes, &m)
	m["cniVersion"], m["name"] = list.CNIVersion, list.Name
	b, _ := json.Marshal(m)
	return b
}

// TestBridgeDelCases: DEL succeeds and still releases IPAM, the masquerade
// rules and the host veth when the namespace was deleted, when CNI_NETNS is
// empty, when there is no prevResult, and for an attachment never added.
func TestBridgeDelCases(t *testing.T) {
	for _, kind := range []string{"bridge", "veth"} {
		t.Run(kind, func(t *testing.T) {
			e := newBridgeEnv(t)
			opts := map[string]any{"isGateway": true, "ipMasq": true, "ipam": e.bridgeOneAddr("198.18.20.0/24", "198.18.20.10")}
			if kind == "veth" {
				opts = map[string]any{"ipMasq": true, "ipam": e.bridgeOneAddr("198.18.24.0/24", "198.18.24.10")}
			}
			name := "mwtb-del-" + kind
			list := e.bridgeKindList(kind, name, opts)
			// released: the one address can be taken again, then freed.
			released := func(t *testing.T) {
				t.Helper()
				b := e.h.Attach(list, e.h.NewNS("br"), "eth0", nil)
				if _, err := b.Add(); err != nil {
					t.Fatalf("the address was not released: %v", err)
				}
				if err := b.Del(); err != nil {
					t.Fatal(err)
				}
			}
			gone := func(t *testing.T, a *harness.Attachment) {
				t.Helper()
				if bridgeHasHostLink(bridgeHostVeth(a)) {
					t.Fatalf("host veth %s left after DEL", bridgeHostVeth(a))
				}
				if bridgeMasqInstalled(t, name, a) {
					t.Fatal("masquerade rules left after DEL")
				}
				released(t)
			}
			t.Run("netns-deleted", func(t *testing.T) {
				ns := e.h.NewNS("br")
				a := e.h.Attach(list, ns, "eth0", nil)
				a.MustAdd()
				if out, err := harness.Run("ip", "netns", "del", ns.Name); err != nil {
					t.Fatalf("ip netns del: %v: %s", err, out)
				}
				if err := a.Del(); err != nil {
					t.Fatalf("DEL: %v", err)
				}
				gone(t, a)
			})
			t.Run("netns-empty", func(t *testing.T) {
				a := e.h.Attach(list, e.h.NewNS("br"), "eth0", nil)
				a.MustAdd()
				a.RT.NetNS = ""
				if err := a.Del(); err != nil {
					t.Fatalf("DEL: %v", err)
				}
				gone(t, a)
			})
			t.Run("no-prevResult", func(t *testing.T) {
				ns := e.h.NewNS("br")
				a := e.h.Attach(list, ns, "eth0", nil)
				a.MustAdd()
				env := map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": a.RT.ContainerID, "CNI_NETNS": ns.Path, "CNI_IFNAME": "eth0", "CNI_PATH": e.h.BinDir}
				if r := e.h.Exec(kind, env, bridgeRawConf(list)); r.ExitCode != 0 {
					t.Fatalf("DEL without prevResult: exit %d: %s %s", r.ExitCode, r.Stdout, r.Stderr)
				}
				if ns.HasLink("eth0") {
					t.Fatal("eth0 left after DEL")
				}
				gone(t, a)
			})
			t.Run("never-added", func(t *testing.T) {
				a := e.h.Attach(list, e.h.NewNS("br"), "eth0", nil)
				for i := 0; i < 2; i++ {
					if err := a.Del(); err != nil {
						t.Fatalf("DEL %d: %v", i+1, err)
					}
				}
			})
		})
	}
}

// TestBridgeConcurrentAdd: 100 pods race onto a bridge that does not exist
// yet; all get distinct addresses on the one bridge, and DEL of all of them
// (also concurrent) leaves nothing.
func TestBridgeConcurrentAdd(t *testing.T) {
	e := newBridgeEnv(t)
	list := e.list("1.1.0", "mwtb-race", map[string]any{"isGateway": true, "ipMasq": true}, "198.18.21.0/24")
	const n = 100
	atts := make([]*harness.Attachment, n)
	for i := range atts {
		atts[i] = e.h.Attach(list, e.h.NewNS("br"), "eth0", nil)
	}
	results := make([]types.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range atts {
		wg.Add(1)
		go func(i int) { defer wg.Done(); results[i], errs[i] = atts[i].Add() }(i)
	}
	wg.Wait()
	seen := map[string]bool{}
	br := bridgeHostLink(t, e.br)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
		cr, err := current.NewResultFromResult(results[i])
		if err != nil {
			t.Fatal(err)
		}
		v4, _ := bridgeIPs(t, cr)
		if seen[v4.String()] {
			t.Fatalf("address %s handed out twice", v4)
		}
		seen[v4.String()] = true
		if bridgeHostLink(t, bridgeHostVeth(atts[i])).Attrs().MasterIndex != br.Attrs().Index {
			t.Fatalf("pod %d is not on %s", i, e.br)
		}
	}
	bridgeMustPing(t, atts[0].NS, "198.18.21.1")
	for i := range atts {
		wg.Add(1)
		go func(i int) { defer wg.Done(); errs[i] = atts[i].Del() }(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("DEL %d: %v", i, err)
		}
		if bridgeMasqInstalled(t, "mwtb-race", atts[i]) {
			t.Fatalf("masquerade of pod %d left", i)
		}
	}
	if l, _ := netlinksafe.LinkList(); len(l) > 0 {
		for _, x := range l {
			if x.Attrs().MasterIndex == br.Attrs().Index {
				t.Fatalf("%s still has port %s", e.br, x.Attrs().Name)
			}
		}
	}
}

// TestBridgeFailureInjection: a failing ADD undoes everything it did,
// IPAM included.
func TestBridgeFailureInjection(t *testing.T) {
	for _, kind := range []string{"bridge", "veth"} {
		t.Run(kind, func(t *testing.T) {
			// An IPAM plugin that deletes the pod's namespace, then hands
			// over to host-local: the namespace vanishes in the middle of ADD.
			dir := t.TempDir()
			script := "#!/bin/sh\nif [ \"$CNI_COMMAND\" = ADD ]; then ip netns del \"$(basename \"$CNI_NETNS\")\"; fi\nexec " +
				filepath.Join(harness.BinDir(t), "host-local") + "\n"
			if err := os.WriteFile(filepath.Join(dir, "mwtb-vanish"), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			e := newBridgeEnv(t, dir)
			subnet, addr := "198.18.22.0/24", "198.18.22.10"
			if kind == "veth" {
				subnet, addr = "198.18.25.0/24", "198.18.25.10"
			}
			good := e.bridgeOneAddr(subnet, addr)
			vanish := e.bridgeOneAddr(subnet, addr)
			vanish["type"] = "mwtb-vanish"
			name := "mwtb-fail-" + kind
			check := func(t *testing.T, a *harness.Attachment) {
				t.Helper()
				if bridgeHasHostLink(bridgeHostVeth(a)) {
					t.Fatal("host veth left by a failed ADD")
				}
				if bridgeMasqInstalled(t, name, a) {
					t.Fatal("masquerade rules left by a failed ADD")
				}
				b := e.h.Attach(e.bridgeKindList(kind, name, map[string]any{"ipMasq": true, "isGateway": true, "ipam": good}), e.h.NewNS("br"), "eth0", nil)
				if _, err := b.Add(); err != nil {
					t.Fatalf("the address of the failed ADD was not released: %v", err)
				}
				if err := b.Del(); err != nil {
					t.Fatal(err)
				}
			}
			t.Run("netns-vanishes", func(t *testing.T) {
				a := e.h.Attach(e.bridgeKindList(kind, name, map[string]any{"ipMasq": true, "isGateway": true, "ipam": vanish}), e.h.NewNS("br"), "eth0", nil)
				_, err := a.Add()
				assertCNIError(t, err, 4, "CNI_NETNS")
				check(t, a)
			})
			t.Run("ipam-fails", func(t *testing.T) {
				taken := e.h.Attach(e.bridgeKindList(kind, name, map[string]any{"ipam": good}), e.h.NewNS("br"), "eth0", nil)
				taken.MustAdd()
				ns := e.h.NewNS("br")
				a := e.h.Attach(e.bridgeKindList(kind, name, map[string]any{"ipMasq": true, "ipam": good}), ns, "eth0", nil)
				if _, err := a.Add(); err == nil {
					t.Fatal("ADD succeeded with the range exhausted")
				}
				if ns.HasLink("eth0") || bridgeHasHostLink(bridgeHostVeth(a)) {
					t.Fatal("veth left by a failed ADD")
				}
				if err := taken.Del(); err != nil {
					t.Fatal(err)
				}
				check(t, a)
			})
			if kind == "bridge" {
				t.Run("gateway-conflict", func(t *testing.T) {
					// The bridge carries another IPv4 address: the gateway
					// cannot be set, after IPAM, veth and all succeeded.
					e.h.Attach(e.list("1.1.0", "mwtb-other", map[string]any{"isGateway": true, "forceAddress": true}, "198.18.23.0/24"), e.h.NewNS("br"), "eth0", nil).MustAdd()
					a := e.h.Attach(e.bridgeKindList(kind, name, map[string]any{"ipMasq": true, "isGateway": true, "ipam": good}), e.h.NewNS("br"), "eth0", nil)
					_, err := a.Add()
					assertCNIError(t, err, 7, "forceAddress")
					if bridgeHasHostLink(bridgeHostVeth(a)) || bridgeMasqInstalled(t, name, a) {
						t.Fatal("failed ADD left its veth or masquerade")
					}
					f := e.h.Attach(e.bridgeKindList(kind, name, map[string]any{"isGateway": true, "forceAddress": true, "ipam": good}), e.h.NewNS("br"), "eth0", nil)
					if _, err := f.Add(); err != nil {
						t.Fatalf("the address of the failed ADD was not released: %v", err)
					}
				})
			}
		})
	}
}
