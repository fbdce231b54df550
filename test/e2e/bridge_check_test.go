//go:build kernel

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/test/harness"
)

// TestBridgeCheckDetects: CHECK fails, naming what is wrong, when the
// container address, the bridge membership or the masquerade rules are gone.
func TestBridgeCheckDetects(t *testing.T) {
	for _, kind := range []string{"bridge", "veth"} {
		t.Run(kind, func(t *testing.T) {
			e := newBridgeEnv(t)
			opts := map[string]any{"isGateway": true, "ipMasq": true, "ipMasqBackend": "nftables"}
			subnet := "198.18.20.0/24"
			if kind == "veth" {
				opts = map[string]any{"ipMasq": true, "ipMasqBackend": "nftables"}
				subnet = "198.18.26.0/24"
			}
			opts["ipam"] = map[string]any{"type": "host-local", "dataDir": e.dataDir, "ranges": [][]map[string]string{{{"subnet": subnet}}}}
			list := e.bridgeKindList(kind, "mwtb-check-"+kind, opts)
			attach := func() (*harness.Attachment, *harness.NS) {
				ns := e.h.NewNS("br")
				a := e.h.Attach(list, ns, "eth0", nil)
				a.MustAdd()
				if err := a.Check(); err != nil {
					t.Fatalf("CHECK right after ADD: %v", err)
				}
				return a, ns
			}
			t.Run("address", func(t *testing.T) {
				a, ns := attach()
				l := ns.Link("eth0")
				addrs, _ := ns.Netlink().AddrList(l, netlink.FAMILY_V4)
				if err := ns.Netlink().AddrDel(l, &addrs[0]); err != nil {
					t.Fatal(err)
				}
				if err := a.Check(); err == nil || !strings.Contains(err.Error(), "lacks address") {
					t.Fatalf("CHECK with the address removed: %v", err)
				}
			})
			t.Run("masquerade", func(t *testing.T) {
				a, _ := attach()
				m := attachment.ID{Network: list.Name, ContainerID: a.RT.ContainerID, IfName: "eth0"}
				if out, err := harness.Run("nft", "delete", "table", "inet", m.MasqTable()); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
				if err := a.Check(); err == nil || !strings.Contains(err.Error(), "ipMasq") {
					t.Fatalf("CHECK with the masquerade gone: %v", err)
				}
			})
			t.Run("host-end", func(t *testing.T) {
				a, _ := attach()
				host := bridgeHostLink(t, bridgeHostVeth(a))
				var err error
				if kind == "bridge" {
					err = netlink.LinkSetNoMaster(host)
				} else {
					addrs, _ := netlinksafe.AddrList(host, netlink.FAMILY_V4)
					err = netlink.AddrDel(host, &addrs[0])
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := a.Check(); err == nil || !strings.Contains(err.Error(), bridgeHostVeth(a)) {
					t.Fatalf("CHECK with the host end broken: %v", err)
				}
			})
		})
	}
}

// TestBridgeGC: GC removes the masquerade of attachments not in the valid
// list (with both backends) and only of this network, and delegates to IPAM
// (the address of a collected attachment can be handed out again).
func TestBridgeGC(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables", "legacy"} {
		t.Run(backend, func(t *testing.T) {
			e := newBridgeEnv(t)
			ipam := e.bridgeOneAddr("198.18.21.0/24", "198.18.21.10")
			list := e.list("1.1.0", "mwtb-gc", map[string]any{"ipMasq": true, "ipMasqBackend": backend, "ipam": map[string]any{
				"type": "host-local", "dataDir": e.dataDir, "ranges": [][]map[string]string{{{"subnet": "198.18.21.0/24", "rangeStart": "198.18.21.10", "rangeEnd": "198.18.21.11"}}}}})
			other := e.list("1.1.0", "mwtb-gc-other", map[string]any{"ipMasq": true, "ipMasqBackend": backend}, "198.18.22.0/24")
			keep, drop := e.h.Attach(list, e.h.NewNS("br"), "eth0", nil), e.h.Attach(list, e.h.NewNS("br"), "eth0", nil)
			keep.MustAdd()
			drop.MustAdd()
			o := e.h.Attach(other, e.h.NewNS("br"), "eth0", nil)
			o.MustAdd()
			if err := e.h.GC(list, keep.GCAttachment()); err != nil {
				t.Fatalf("GC: %v", err)
			}
			if !bridgeMasqInstalled(t, "mwtb-gc", keep) {
				t.Fatal("GC removed the masquerade of a valid attachment")
			}
			if bridgeMasqInstalled(t, "mwtb-gc", drop) {
				t.Fatal("GC left the masquerade of a stale attachment")
			}
			if !bridgeMasqInstalled(t, "mwtb-gc-other", o) {
				t.Fatal("GC of one network removed another network's masquerade")
			}
			// IPAM GC released the stale attachment's address: the range
			// (two addresses) has room again.
			third := e.h.Attach(list, e.h.NewNS("br"), "eth0", nil)
			if _, err := third.Add(); err != nil {
				t.Fatalf("the collected address was not released: %v", err)
			}
			_ = ipam
		})
	}
}

// TestBridgeAnnounce: after ADD, a neighbour's ARP and ND caches learn the
// new owner of a recycled address without any traffic from it (gratuitous
// ARP and unsolicited NA).
func TestBridgeAnnounce(t *testing.T) {
	e := newBridgeEnv(t)
	ipam := map[string]any{"type": "host-local", "dataDir": e.dataDir, "ranges": [][]map[string]string{
		{{"subnet": "198.18.23.0/24", "rangeStart": "198.18.23.10", "rangeEnd": "198.18.23.10"}},
		{{"subnet": "fd20:0:0:23::/64", "rangeStart": "fd20:0:0:23::10", "rangeEnd": "fd20:0:0:23::10"}}}}
	list := e.list("1.1.0", "mwtb-announce", map[string]any{"ipam": ipam})
	peerList := e.list("1.1.0", "mwtb-announce-peer", nil, "198.18.23.0/24", "fd20:0:0:23::/64")
	peerNS := e.h.NewNS("br")
	e.h.Attach(peerList, peerNS, "eth0", nil).MustAdd()
	first := e.h.Attach(list, e.h.NewNS("br"), "eth0", nil)
	first.MustAdd()
	bridgeMustPing(t, peerNS, "198.18.23.10")
	bridgeMustPing(t, peerNS, "fd20:0:0:23::10")
	if err := first.Del(); err != nil {
		t.Fatal(err)
	}
	ns := e.h.NewNS("br")
	second := e.h.Attach(list, ns, "eth0", map[string]any{})
	r := second.MustAdd()
	mac := r.Interfaces[2].Mac
	for _, ip := range []string{"198.18.23.10", "fd20:0:0:23::10"} {
		if got := bridgeWaitNeigh(t, peerNS, ip, mac); got != mac {
			t.Fatalf("peer's neighbour entry for %s is %s, want the new owner %s", ip, got, mac)
		}
	}
}

// bridgeWaitNeigh waits (at most 3 s) until the namespace's neighbour entry
// for ip has MAC want, and returns the last MAC seen.
func bridgeWaitNeigh(t *testing.T, ns *harness.NS, ip, want string) string {
	t.Helper()
	fam := netlink.FAMILY_V4
	if net.ParseIP(ip).To4() == nil {
		fam = netlink.FAMILY_V6
	}
	last := ""
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		neighs, err := ns.Netlink().NeighList(0, fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range neighs {
			if n.IP.Equal(net.ParseIP(ip)) {
				last = n.HardwareAddr.String()
			}
		}
		if last == want {
			return last
		}
	}
	return last
}

// TestBridgeBadInput runs the binaries the way a broken runtime would:
// each case is a CNI error with the right code naming the culprit, and
// nothing is left on the host.
func TestBridgeBadInput(t *testing.T) {
	e := newBridgeEnv(t)
	ns := e.h.NewNS("br")
	base := func(kind string, extra string) string {
		c := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwtb-bad","type":%q,"bridge":%q,"hostVethPrefix":"mwtb","ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.23.0/24"}]]}`, kind, e.br, e.dataDir)
		if extra != "" {
			c += "," + extra
		}
		return c + "}"
	}
	for _, tc := range []struct {
		name, kind, cmd, stdin string
		env                    map[string]string
		code                   uint
		msg                    string
	}{
		{"not json", "bridge", "ADD", `{"cniVersion":`, nil, 6, ""},
		{"hairpin and promisc", "bridge", "ADD", base("bridge", `"hairpinMode":true,"promiscMode":true`), nil, 7, "hairpinMode"},
		{"vlan range", "bridge", "ADD", base("bridge", `"vlan":5000`), nil, 7, "vlan"},
		{"trunk", "bridge", "ADD", base("bridge", `"vlanTrunk":[{"minID":3}]`), nil, 7, "vlanTrunk[0].maxID"},
		{"mtu", "bridge", "ADD", base("bridge", `"mtu":"big"`), nil, 7, "mtu"},
		{"backend", "veth", "ADD", base("veth", `"ipMasq":true,"ipMasqBackend":"pf"`), nil, 7, "ipMasqBackend"},
		{"mac", "veth", "ADD", base("veth", `"runtimeConfig":{"mac":"zz"}`), nil, 7, "runtimeConfig.mac"},
		{"no ipam", "veth", "ADD", `{"cniVersion":"1.1.0","name":"n","type":"veth"}`, nil, 7, "ipam.type"},
		{"missing netns", "bridge", "ADD", base("bridge", ""), map[string]string{"CNI_NETNS": "/run/netns/mwtb-does-not-exist"}, 4, "CNI_NETNS"},
		{"netns not a namespace", "veth", "ADD", base("veth", ""), map[string]string{"CNI_NETNS": "/proc/self/status"}, 4, "CNI_NETNS"},
		{"bad ifname", "bridge", "ADD", base("bridge", ""), map[string]string{"CNI_IFNAME": "a/b"}, 4, "interface name"},
		{"ifname taken", "veth", "ADD", base("veth", ""), map[string]string{"CNI_IFNAME": "lo"}, 4, "CNI_IFNAME"},
		{"ipam missing", "bridge", "ADD", strings.Replace(base("bridge", ""), `"type":"host-local"`, `"type":"mwtb-no-such-ipam"`, 1), nil, 999, "mwtb-no-such-ipam"},
		{"status ipam missing", "bridge", "STATUS", strings.Replace(base("bridge", ""), `"type":"host-local"`, `"type":"mwtb-no-such-ipam"`, 1), nil, 50, "mwtb-no-such-ipam"},
		{"check without prevResult", "bridge", "CHECK", base("bridge", ""), nil, 7, "prevResult"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"CNI_COMMAND": tc.cmd, "CNI_CONTAINERID": "mwtb-bad-" + tc.kind, "CNI_NETNS": ns.Path, "CNI_IFNAME": "eth0", "CNI_PATH": e.h.BinDir}
			for k, v := range tc.env {
				env[k] = v
			}
			e.h.Exec(tc.kind, env, []byte(tc.stdin)).WantCNIError(t, tc.code, tc.msg)
			if ns.HasLink("eth0") {
				t.Fatal("a failed ADD left eth0")
			}
		})
	}
}

func TestBridgeVethVersion(t *testing.T) {
	h := harness.New(t)
	for _, p := range []string{"bridge", "veth"} {
		got, err := h.Version(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
			if !slices.Contains(got, v) {
				t.Fatalf("%s VERSION %v lacks %s", p, got, v)
			}
		}
		r := h.Exec(p, map[string]string{"CNI_COMMAND": "VERSION"}, nil)
		var info struct{ Implementation string }
		if err := json.Unmarshal(r.Stdout, &info); err != nil || !strings.HasPrefix(info.Implementation, "meshwire "+p+" ") {
			t.Fatalf("%s VERSION %q does not name meshwire (%v)", p, r.Stdout, err)
		}
	}
}
