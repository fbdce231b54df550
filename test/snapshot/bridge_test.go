package main

import (
	"net/netip"
	"regexp"
	"testing"
)

// TestBridgeAllows: what the bridge explains is allowed line by line, and
// nothing else: not another link, not a route of another interface or to
// another network, not a rule or a file that names the bridge.
func TestBridgeAllows(t *testing.T) {
	ok := bridgeAllows("cni0", 7, "bridge", []netip.Prefix{
		netip.MustParsePrefix("198.18.1.1/24"), netip.MustParsePrefix("fe80::1/64"),
	})
	for _, d := range []string{
		`links: added "cni0 type=bridge"`,
		`addrs: added "198.18.1.1/24"`,
		`addrs: added "fe80::1/64"`,
		`routes: added "table=254 {Ifindex: 7 Dst: 198.18.1.0/24 Src: 198.18.1.1 Gw: <nil> Flags: [] Table: 254 Realm: 0}"`,
		`routes: added "table=255 {Ifindex: 7 Dst: 198.18.1.1/32 Src: 198.18.1.1 Gw: <nil> Flags: [] Table: 255 Realm: 0 Type: local}"`,
		`routes: added "table=255 {Ifindex: 7 Dst: 198.18.1.255/32 Src: 198.18.1.1 Gw: <nil> Flags: [] Table: 255 Realm: 0 Type: broadcast}"`,
		`routes: added "table=254 {Ifindex: 7 Dst: fe80::/64 Src: <nil> Gw: <nil> Flags: [] Table: 254 Realm: 0}"`,
		`routes: added "table=255 {Ifindex: 7 Dst: ff00::/8 Src: <nil> Gw: <nil> Flags: [] Table: 255 Realm: 0 Type: multicast}"`,
		`sysctls: added "net/ipv4/conf/cni0/route_localnet=0"`,
		`sysctls: added "net/ipv6/conf/cni0/accept_ra=1"`,
		`qdiscs: added "cni0 noqueue handle=none parent=root"`,
		`sysctls: added "net/ipv4/ip_forward=1"`,
		`sysctls: removed "net/ipv4/ip_forward=0"`,
	} {
		if !ok(d) {
			t.Errorf("not allowed, but the bridge explains it: %s", d)
		}
	}
	for _, d := range []string{
		`links: added "veth1234 type=veth"`,
		`links: added "cni0 type=veth"`,
		`qdiscs: added "cni0 tbf handle=1: parent=root"`,
		`qdiscs: added "eth0 noqueue handle=none parent=root"`,
		`addrs: added "198.18.2.1/24"`,
		`routes: added "table=254 {Ifindex: 8 Dst: 198.18.1.0/24 Src: 198.18.1.1 Gw: <nil> Flags: [] Table: 254 Realm: 0}"`,
		`routes: added "table=254 {Ifindex: 7 Dst: 0.0.0.0/0 Src: <nil> Gw: 198.18.1.254 Flags: [] Table: 254 Realm: 0}"`,
		`routes: added "table=254 {Ifindex: 7 Dst: 198.18.0.0/16 Src: <nil> Gw: <nil> Flags: [] Table: 254 Realm: 0}"`,
		`routes: removed "table=254 {Ifindex: 7 Dst: 198.18.1.0/24 Src: 198.18.1.1 Gw: <nil> Flags: [] Table: 254 Realm: 0}"`,
		`sysctls: added "net/ipv4/ip_forward=0"`,
		`sysctls: added "net/ipv4/conf/eth0/route_localnet=1"`,
		`iptables-save: added "-A POSTROUTING -o cni0 -j MASQUERADE"`,
		`nft: added "iifname cni0 accept"`,
		`files: added "/var/lib/cni/networks/cbr0/198.18.1.2"`,
	} {
		if ok(d) {
			t.Errorf("allowed, but the bridge does not explain it: %s", d)
		}
	}
}

// TestOthersNetns: only the namespaces of the given names are judged.
func TestOthersNetns(t *testing.T) {
	ok := othersNetns(regexp.MustCompile(`^(cni-|mwk-node)`))
	for d, want := range map[string]bool{
		`netns: removed "mwt-mwti-pod-8435-990"`: true,
		`netns: added "mwt-rand-71eb0232"`:       true,
		`netns: added "mwk-node1"`:               false,
		`netns: removed "cni-1234"`:              false,
		`links: added "mwk-node1 type=veth"`:     false,
	} {
		if ok(d) != want {
			t.Errorf("%s: allowed %v, want %v", d, ok(d), want)
		}
	}
}
