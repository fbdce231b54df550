package main

import (
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/cnierr"
)

func cidr(s string) net.IPNet {
	ip, n, _ := net.ParseCIDR(s)
	n.IP = ip
	return *n
}

func TestContainerRoutes(t *testing.T) {
	ips := []*current.IPConfig{{Address: cidr("198.18.24.5/24"), Gateway: net.ParseIP("198.18.24.1")}}
	got, err := containerRoutes(ips, []*types.Route{{Dst: cidr("0.0.0.0/0")}}, 4)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, r := range got {
		s = append(s, r.Dst.String()+" gw="+r.Gw.String())
	}
	want := []string{"198.18.24.1/32 gw=<nil>", "198.18.24.0/24 gw=198.18.24.1", "0.0.0.0/0 gw=198.18.24.1"}
	if strings.Join(s, ",") != strings.Join(want, ",") {
		t.Fatalf("routes %v, want %v", s, want)
	}
	if _, err := containerRoutes([]*current.IPConfig{{Address: cidr("198.18.24.5/24")}}, nil, 4); err == nil {
		t.Fatal("an address without gateway was accepted")
	}
}

func TestHostSide(t *testing.T) {
	ips := []*current.IPConfig{
		{Address: cidr("198.18.24.5/24"), Gateway: net.ParseIP("198.18.24.1")},
		{Address: cidr("fd20:0:0:24::5/64"), Gateway: net.ParseIP("fd20:0:0:24::1")},
	}
	a := hostAddrs(ips)
	if len(a) != 2 || a[0].String() != "198.18.24.1/32" || a[1].String() != "fd20:0:0:24::1/128" {
		t.Fatalf("host addresses %v", a)
	}
	r := hostRoutes(ips, 9)
	if len(r) != 2 || r[0].Dst.String() != "198.18.24.5/32" || r[1].Dst.String() != "fd20:0:0:24::5/128" {
		t.Fatalf("host routes %v", r)
	}
	// Scope host, as the reference ptp's ip.AddHostRoute.
	if r[0].Scope != netlink.SCOPE_HOST || r[1].Scope != netlink.SCOPE_HOST {
		t.Fatalf("host routes %v: want scope host", r)
	}
}

func TestParseConfig(t *testing.T) {
	if _, err := parseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"ptp","ipam":{"type":"host-local"}}`), ""); err != nil {
		t.Fatalf("a ptp config: %v", err)
	}
	for _, tc := range []struct{ conf, field string }{
		{`{"cniVersion":"1.0.0","name":"n","type":"veth"}`, "ipam.type"},
		{`{"cniVersion":"1.0.0","name":"n","type":"veth","ipam":{"type":"host-local"},"mtu":-1}`, "mtu"},
		{`{"cniVersion":"1.0.0","name":"n","type":"veth","ipam":{"type":"host-local"},"ipMasq":"yes"}`, "ipMasq"},
		{`{"cniVersion":"1.0.0","name":"n","type":"bridge","ipam":{"type":"host-local"}}`, "type"},
	} {
		_, err := parseConfig([]byte(tc.conf), "")
		if cnierr.Code(err) != 7 || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v, want code 7 naming %s", tc.conf, err, tc.field)
		}
	}
}
