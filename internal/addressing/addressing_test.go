package addressing

import (
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"golang.org/x/sys/unix"
)

func cidr(s string) net.IPNet {
	ip, n, _ := net.ParseCIDR(s)
	n.IP = ip
	return *n
}

func TestRoutesFillGateway(t *testing.T) {
	ips := []*current.IPConfig{
		{Address: cidr("198.18.16.5/24"), Gateway: net.ParseIP("198.18.16.1")},
		{Address: cidr("fd20::5/64"), Gateway: net.ParseIP("fd20::1")},
	}
	scope := 253
	table := 100
	routes := []*types.Route{
		{Dst: cidr("0.0.0.0/0")},
		{Dst: cidr("::/0")},
		{Dst: cidr("198.18.30.0/24"), GW: net.ParseIP("198.18.16.9"), MTU: 1400, Scope: &scope, Table: &table},
	}
	got := Routes(ips, routes, 7)
	if len(got) != 3 {
		t.Fatalf("%d routes", len(got))
	}
	if !got[0].Gw.Equal(net.ParseIP("198.18.16.1")) || !got[1].Gw.Equal(net.ParseIP("fd20::1")) {
		t.Fatalf("gateways not filled per family: %v %v", got[0].Gw, got[1].Gw)
	}
	if !got[2].Gw.Equal(net.ParseIP("198.18.16.9")) || got[2].MTU != 1400 || int(got[2].Scope) != 253 || got[2].Table != 100 || got[2].LinkIndex != 7 {
		t.Fatalf("route attributes lost: %+v", got[2])
	}
}

func TestIPsForAndAddr(t *testing.T) {
	zero, one := 0, 1
	ips := []*current.IPConfig{{Address: cidr("198.18.16.5/24"), Interface: &one}, {Address: cidr("fd20::5/64"), Interface: &zero}, {Address: cidr("198.18.17.5/24")}}
	if got := IPsFor(ips, 1); len(got) != 2 {
		t.Fatalf("IPsFor: %d, want 2 (own and unassigned)", len(got))
	}
	if a := Addr(ips[1], Options{}); a.Flags&unix.IFA_F_NODAD == 0 {
		t.Fatal("IPv6 without DAD must be NODAD")
	}
	if a := Addr(ips[1], Options{DAD: true}); a.Flags&unix.IFA_F_NODAD != 0 {
		t.Fatal("enabledad must keep DAD")
	}
	if a := Addr(ips[0], Options{NoPrefixRoute: true}); a.Flags != unix.IFA_F_NOPREFIXROUTE {
		t.Fatalf("flags %x", a.Flags)
	}
}
