//go:build kernel

package e2e

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/test/harness"
)

// bridgePortVlans returns the VLANs of a host port as "vid[P][U]" strings
// (P: PVID, U: untagged).
func bridgePortVlans(t *testing.T, port string) []string {
	t.Helper()
	all, err := netlinksafe.BridgeVlanList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range all[int32(bridgeHostLink(t, port).Attrs().Index)] {
		s := fmt.Sprint(v.Vid)
		if v.Flags&nl.BRIDGE_VLAN_INFO_PVID != 0 {
			s += "P"
		}
		if v.Flags&nl.BRIDGE_VLAN_INFO_UNTAGGED != 0 {
			s += "U"
		}
		out = append(out, s)
	}
	return out
}

func bridgeProtinfo(t *testing.T, port string) netlink.Protinfo {
	t.Helper()
	p, err := netlink.LinkGetProtinfo(bridgeHostLink(t, port))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBridgeOptions covers the reference's per-port and per-bridge options
// one by one, on what the kernel shows and, where it matters, on traffic.
func TestBridgeOptions(t *testing.T) {
	e := newBridgeEnv(t)
	net4 := func(n int) string { return fmt.Sprintf("198.18.%d.0/24", n) }
	t.Run("mtu", func(t *testing.T) {
		e := newBridgeEnv(t)
		ns := e.h.NewNS("br")
		a := e.h.Attach(e.list("1.1.0", "mwtb-mtu", map[string]any{"mtu": 1400, "isGateway": true}, net4(23)), ns, "eth0", nil)
		a.MustAdd()
		if m := ns.Link("eth0").Attrs().MTU; m != 1400 {
			t.Fatalf("eth0 MTU %d", m)
		}
		if m := bridgeHostLink(t, bridgeHostVeth(a)).Attrs().MTU; m != 1400 {
			t.Fatalf("host veth MTU %d", m)
		}
		if m := bridgeHostLink(t, e.br).Attrs().MTU; m != 1400 {
			t.Fatalf("bridge MTU %d", m)
		}
		bridgeMustPing(t, ns, "198.18.23.1")
	})
	t.Run("hairpin", func(t *testing.T) {
		a := e.h.Attach(e.list("1.1.0", "mwtb-hairpin", map[string]any{"hairpinMode": true}, net4(23)), e.h.NewNS("br"), "eth0", nil)
		a.MustAdd()
		if !bridgeProtinfo(t, bridgeHostVeth(a)).Hairpin {
			t.Fatal("hairpin mode not set on the port")
		}
		if err := a.Check(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("mac", func(t *testing.T) {
		conf := e.plugin(map[string]any{"capabilities": map[string]bool{"mac": true}}, net4(23))
		list := e.h.Single("1.1.0", "mwtb-mac", conf)
		ns := e.h.NewNS("br")
		a := e.h.Attach(list, ns, "eth0", map[string]any{"mac": "02:00:5e:10:00:01"})
		r := a.MustAdd()
		if got := ns.Link("eth0").Attrs().HardwareAddr.String(); got != "02:00:5e:10:00:01" || r.Interfaces[2].Mac != got {
			t.Fatalf("eth0 MAC %s (result %s), want the capability's", got, r.Interfaces[2].Mac)
		}
		ns2 := e.h.NewNS("br")
		b := e.h.Attach(e.list("1.1.0", "mwtb-mac2", nil, net4(23)), ns2, "eth0", nil)
		b.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"MAC", "02:00:5e:10:00:02"}}
		b.MustAdd()
		if got := ns2.Link("eth0").Attrs().HardwareAddr.String(); got != "02:00:5e:10:00:02" {
			t.Fatalf("eth0 MAC %s, want CNI_ARGS MAC", got)
		}
	})
	t.Run("macspoofchk", func(t *testing.T) {
		ns := e.h.NewNS("br")
		list := e.list("1.1.0", "mwtb-spoof", map[string]any{"macspoofchk": true, "isGateway": true}, net4(23))
		a := e.h.Attach(list, ns, "eth0", nil)
		a.MustAdd()
		bridgeMustPing(t, ns, "198.18.23.1")
		nl := ns.Netlink()
		l := ns.Link("eth0")
		if err := nl.LinkSetDown(l); err != nil {
			t.Fatal(err)
		}
		mac, _ := net.ParseMAC("02:00:5e:10:00:99")
		if err := nl.LinkSetHardwareAddr(l, mac); err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		bridgeMustNotPing(t, ns, "198.18.23.1")
		if err := a.Del(); err != nil {
			t.Fatal(err)
		}
		if out, _ := harness.Run("nft", "list", "tables", "bridge"); strings.Contains(out, "meshwire_macspoof") {
			t.Fatalf("macspoofchk table left after DEL: %s", out)
		}
		// GC removes the tables of attachments not in the valid list only.
		keep, drop := e.h.Attach(list, e.h.NewNS("br"), "eth0", nil), e.h.Attach(list, e.h.NewNS("br"), "eth0", nil)
		keep.MustAdd()
		drop.MustAdd()
		if err := e.h.GC(list, keep.GCAttachment()); err != nil {
			t.Fatalf("GC: %v", err)
		}
		out, _ := harness.Run("nft", "list", "tables", "bridge")
		if n := strings.Count(out, "meshwire_macspoof"); n != 1 {
			t.Fatalf("after GC keeping one attachment, %d macspoofchk tables:\n%s", n, out)
		}
		bridgeMustPing(t, keep.NS, "198.18.23.1")
		if err := keep.Del(); err != nil {
			t.Fatal(err)
		}
		if err := drop.Del(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("layer2", func(t *testing.T) {
		ns := e.h.NewNS("br")
		a := e.h.Attach(e.list("1.1.0", "mwtb-l2", map[string]any{"ipam": nil}), ns, "eth0", nil)
		r := a.MustAdd()
		if len(r.IPs) != 0 || !ns.IsUp("eth0") {
			t.Fatalf("L2 attachment: IPs %v, eth0 up %v", r.IPs, ns.IsUp("eth0"))
		}
		if err := a.Check(); err != nil {
			t.Fatalf("CHECK of an L2 attachment: %v", err)
		}
		ns2 := e.h.NewNS("br")
		down := e.h.Attach(e.list("1.1.0", "mwtb-l2down", map[string]any{"ipam": nil, "disableContainerInterface": true}), ns2, "eth0", nil)
		down.MustAdd()
		if ns2.IsUp("eth0") {
			t.Fatal("disableContainerInterface: eth0 is up")
		}
		if err := down.Check(); err != nil {
			t.Fatalf("CHECK with disableContainerInterface: %v", err)
		}
	})
	t.Run("default-gateway", func(t *testing.T) {
		ns := e.h.NewNS("br")
		e.h.Attach(e.list("1.1.0", "mwtb-defgw", map[string]any{"isDefaultGateway": true}, net4(23), "fd20:0:0:23::/64"), ns, "eth0", nil).MustAdd()
		found := 0
		for _, r := range ns.Routes(netlink.FAMILY_ALL) {
			if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw != nil && (r.Gw.String() == "198.18.23.1" || r.Gw.String() == "fd20:0:0:23::1") {
				found++
			}
		}
		if found != 2 {
			t.Fatalf("want a default route per family through the bridge, routes: %v", ns.Routes(netlink.FAMILY_ALL))
		}
		if !slices.Contains(ns.Addrs("eth0"), "fd20:0:0:23::2/64") {
			t.Fatalf("addresses %v", ns.Addrs("eth0"))
		}
	})
}

// TestBridgeVlan: an access VLAN with its gateway interface (traffic to the
// gateway crosses the VLAN), and a trunk port.
func TestBridgeVlan(t *testing.T) {
	e := newBridgeEnv(t)
	if !bridgeKernelHasVlanFiltering(t) {
		bridgeVlanUnsupported(t, e)
		return
	}
	ns := e.h.NewNS("br")
	a := e.h.Attach(e.list("1.1.0", "mwtb-vlan", map[string]any{"vlan": 100, "isGateway": true}, "198.18.23.0/24"), ns, "eth0", nil)
	r := a.MustAdd()
	gw := e.br + ".100"
	if last := r.Interfaces[len(r.Interfaces)-1]; last.Name != gw {
		t.Fatalf("result interfaces %+v lack the VLAN gateway %s", r.Interfaces, gw)
	}
	addrs, err := netlinksafe.AddrList(bridgeHostLink(t, gw), netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != "198.18.23.1/24" {
		t.Fatalf("VLAN gateway addresses %v (%v)", addrs, err)
	}
	if got := bridgePortVlans(t, bridgeHostVeth(a)); strings.Join(got, ",") != "100PU" {
		t.Fatalf("port VLANs %v, want only 100 as PVID untagged", got)
	}
	if v := bridgeHostLink(t, e.br).(*netlink.Bridge).VlanFiltering; v == nil || !*v {
		t.Fatal("VLAN filtering is off on the bridge")
	}
	bridgeMustPing(t, ns, "198.18.23.1")
	if err := a.Check(); err != nil {
		t.Fatalf("CHECK: %v", err)
	}

	trunk := e.h.Attach(e.list("1.1.0", "mwtb-trunk", map[string]any{"ipam": nil, "vlanTrunk": []map[string]int{{"id": 5}, {"minID": 10, "maxID": 12}}}), e.h.NewNS("br"), "eth0", nil)
	trunk.MustAdd()
	if got := bridgePortVlans(t, bridgeHostVeth(trunk)); strings.Join(got, ",") != "1PU,5,10,11,12" {
		t.Fatalf("trunk port VLANs %v, want 1PU,5,10,11,12", got)
	}
	keep := e.h.Attach(e.list("1.1.0", "mwtb-trunk2", map[string]any{"ipam": nil, "vlan": 7, "preserveDefaultVlan": true}), e.h.NewNS("br"), "eth0", nil)
	keep.MustAdd()
	if got := bridgePortVlans(t, bridgeHostVeth(keep)); strings.Join(got, ",") != "1,7PU" {
		t.Fatalf("port VLANs with preserveDefaultVlan %v, want 1,7PU", got)
	}
	// As the reference: a trunk keeps VLAN 1 native even with
	// preserveDefaultVlan explicitly false.
	drop := e.h.Attach(e.list("1.1.0", "mwtb-trunk3", map[string]any{"ipam": nil, "vlanTrunk": []map[string]int{{"id": 5}}, "preserveDefaultVlan": false}), e.h.NewNS("br"), "eth0", nil)
	drop.MustAdd()
	if got := bridgePortVlans(t, bridgeHostVeth(drop)); strings.Join(got, ",") != "1PU,5" {
		t.Fatalf("trunk port VLANs with preserveDefaultVlan false %v, want 1PU,5", got)
	}

	// A bridge made by someone else with another default PVID: the port
	// loses that VLAN, as with the reference, not VLAN 1.
	e2 := newBridgeEnv(t)
	if out, err := harness.Run("ip", "link", "add", e2.br, "type", "bridge", "vlan_filtering", "1", "vlan_default_pvid", "10"); err != nil {
		t.Fatalf("create %s: %v: %s", e2.br, err, out)
	}
	pvid10 := e2.h.Attach(e2.list("1.1.0", "mwtb-pvid10", map[string]any{"ipam": nil, "vlan": 100}), e2.h.NewNS("br"), "eth0", nil)
	pvid10.MustAdd()
	if got := bridgePortVlans(t, bridgeHostVeth(pvid10)); strings.Join(got, ",") != "100PU" {
		t.Fatalf("port VLANs on a bridge with default PVID 10: %v, want only 100PU", got)
	}
}

// TestBridgePromisc: promiscMode on the bridge.
func TestBridgePromisc(t *testing.T) {
	e := newBridgeEnv(t)
	p := e.h.Attach(e.list("1.1.0", "mwtb-promisc", map[string]any{"promiscMode": true}, "198.18.23.0/24"), e.h.NewNS("br"), "eth0", nil)
	p.MustAdd()
	if bridgeHostLink(t, e.br).Attrs().Promisc == 0 {
		t.Fatal("bridge not promiscuous")
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestBridgePortIsolation: isolated ports reach the gateway but not each
// other.
func TestBridgePortIsolation(t *testing.T) {
	e3 := newBridgeEnv(t)
	list := e3.list("1.1.0", "mwtb-iso", map[string]any{"portIsolation": true, "isGateway": true}, "198.18.23.0/24")
	nsA, nsB := e3.h.NewNS("br"), e3.h.NewNS("br")
	ia, ib := e3.h.Attach(list, nsA, "eth0", nil), e3.h.Attach(list, nsB, "eth0", nil)
	ia.MustAdd()
	rb := ib.MustAdd()
	if !bridgeProtinfo(t, bridgeHostVeth(ia)).Isolated {
		t.Fatal("port not isolated")
	}
	bridgeMustPing(t, nsA, "198.18.23.1")
	b4, _ := bridgeIPs(t, rb)
	bridgeMustNotPing(t, nsA, b4.String())
}

// TestBridgeDAD: with enabledad, ADD returns once the IPv6 address passed
// duplicate address detection; without it, ADD never waits for DAD.
func TestBridgeDAD(t *testing.T) {
	e := newBridgeEnv(t)
	ns := e.h.NewNS("br")
	e.h.Attach(e.list("1.1.0", "mwtb-dad", map[string]any{"enabledad": true, "isGateway": true}, "fd20:0:0:23::/64"), ns, "eth0", nil).MustAdd()
	out, err := ns.Exec("ip", "-6", "addr", "show", "dev", "eth0", "tentative")
	if err != nil || strings.Contains(out, "fd20") {
		t.Fatalf("address still tentative after ADD: %s %v", out, err)
	}
	bridgeMustPing(t, ns, "fd20:0:0:23::1")
	ns2 := e.h.NewNS("br")
	e.h.Attach(e.list("1.1.0", "mwtb-nodad", map[string]any{"isGateway": true}, "fd20:0:0:23::/64"), ns2, "eth0", nil).MustAdd()
	out, err = ns2.Exec("ip", "-6", "addr", "show", "dev", "eth0")
	if err != nil || !strings.Contains(out, "nodad") {
		t.Fatalf("without enabledad the address must skip DAD: %s %v", out, err)
	}
	bridgeMustPing(t, ns2, "fd20:0:0:23::1")
}

// bridgeKernelHasVlanFiltering reports whether the kernel can filter VLANs
// on a bridge (CONFIG_BRIDGE_VLAN_FILTERING): the project's test machines'
// kernel cannot.
func bridgeKernelHasVlanFiltering(t *testing.T) bool {
	t.Helper()
	name := "mwt-brv" + harness.RandomID()[:6]
	on := true
	la := netlink.NewLinkAttrs()
	la.Name = name
	err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la, VlanFiltering: &on})
	if err == nil {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
		return true
	}
	if !errors.Is(err, unix.EOPNOTSUPP) {
		t.Fatalf("probe bridge VLAN filtering: %v", err)
	}
	return false
}

// bridgeVlanUnsupported: without kernel support, vlan and vlanTrunk fail with
// code 7 naming the field, before anything is created, and IPAM is released.
func bridgeVlanUnsupported(t *testing.T, e *bridgeEnv) {
	for _, opts := range []map[string]any{
		{"vlan": 100, "isGateway": true, "ipam": e.bridgeOneAddr("198.18.23.0/24", "198.18.23.10")},
		{"vlanTrunk": []map[string]int{{"id": 5}}, "ipam": e.bridgeOneAddr("198.18.23.0/24", "198.18.23.10")},
	} {
		ns := e.h.NewNS("br")
		a := e.h.Attach(e.list("1.1.0", "mwtb-vlan", opts), ns, "eth0", nil)
		_, err := a.Add()
		field := "vlan"
		if _, ok := opts["vlanTrunk"]; ok {
			field = "vlanTrunk"
		}
		assertCNIError(t, err, 7, field+": this kernel has no bridge VLAN filtering")
		if bridgeHasHostLink(e.br) || bridgeHasHostLink(bridgeHostVeth(a)) || ns.HasLink("eth0") {
			t.Fatal("a refused VLAN ADD created links")
		}
		b := e.h.Attach(e.list("1.1.0", "mwtb-vlan", map[string]any{"ipam": e.bridgeOneAddr("198.18.23.0/24", "198.18.23.10")}), e.h.NewNS("br"), "eth0", nil)
		b.MustAdd()
		if err := b.Del(); err != nil {
			t.Fatal(err)
		}
		bridgeRemoveLinks(e.br)
	}
}
