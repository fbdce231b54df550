package main

import (
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

func mustCIDR(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return *n
}

func TestPlanGateways(t *testing.T) {
	for _, tc := range []struct {
		name             string
		isGW, isDefGW    bool
		ips              []*current.IPConfig
		routes           []*types.Route
		wantV4, wantV6   []string
		wantRoutes       []string
		wantGatewayOfIP0 string
	}{
		{
			name: "not a gateway", ips: []*current.IPConfig{{Address: mustCIDR("198.18.16.5/24")}},
			wantGatewayOfIP0: "<nil>",
		},
		{
			name: "gateway computed", isGW: true, ips: []*current.IPConfig{{Address: mustCIDR("198.18.16.5/24")}},
			wantV4: []string{"198.18.16.1/24"}, wantGatewayOfIP0: "198.18.16.1",
		},
		{
			name: "gateway from IPAM", isGW: true, ips: []*current.IPConfig{{Address: mustCIDR("198.18.16.5/24"), Gateway: net.ParseIP("198.18.16.254")}},
			wantV4: []string{"198.18.16.254/24"}, wantGatewayOfIP0: "198.18.16.254",
		},
		{
			name: "default routes dual stack", isGW: true, isDefGW: true,
			ips:    []*current.IPConfig{{Address: mustCIDR("198.18.16.5/24")}, {Address: mustCIDR("fd20::5/64")}},
			wantV4: []string{"198.18.16.1/24"}, wantV6: []string{"fd20::1/64"},
			wantRoutes: []string{"0.0.0.0/0 via 198.18.16.1", "::/0 via fd20::1"}, wantGatewayOfIP0: "198.18.16.1",
		},
		{
			name: "IPAM default route kept", isGW: true, isDefGW: true,
			ips:        []*current.IPConfig{{Address: mustCIDR("198.18.16.5/24")}},
			routes:     []*types.Route{{Dst: mustCIDR("0.0.0.0/0"), GW: net.ParseIP("198.18.16.9")}},
			wantV4:     []string{"198.18.16.1/24"},
			wantRoutes: []string{"0.0.0.0/0 via 198.18.16.9"}, wantGatewayOfIP0: "198.18.16.1",
		},
		{
			name: "two addresses of a family: one default route", isGW: true, isDefGW: true,
			ips:        []*current.IPConfig{{Address: mustCIDR("198.18.16.5/24")}, {Address: mustCIDR("198.18.17.5/24")}},
			wantV4:     []string{"198.18.16.1/24", "198.18.17.1/24"},
			wantRoutes: []string{"0.0.0.0/0 via 198.18.16.1"}, wantGatewayOfIP0: "198.18.16.1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &current.Result{IPs: tc.ips, Routes: tc.routes}
			g := planGateways(r, tc.isGW, tc.isDefGW, 2)
			if got := strs(g.v4); !equal(got, tc.wantV4) {
				t.Errorf("v4 gateways %v, want %v", got, tc.wantV4)
			}
			if got := strs(g.v6); !equal(got, tc.wantV6) {
				t.Errorf("v6 gateways %v, want %v", got, tc.wantV6)
			}
			var routes []string
			for _, rt := range r.Routes {
				routes = append(routes, rt.Dst.String()+" via "+rt.GW.String())
			}
			if !equal(routes, tc.wantRoutes) {
				t.Errorf("routes %v, want %v", routes, tc.wantRoutes)
			}
			if got := r.IPs[0].Gateway.String(); got != tc.wantGatewayOfIP0 {
				t.Errorf("gateway of the first IP %s, want %s", got, tc.wantGatewayOfIP0)
			}
			for _, ip := range r.IPs {
				if ip.Interface == nil || *ip.Interface != 2 {
					t.Errorf("IP %s not pointed at the container interface", ip.Address.String())
				}
			}
		})
	}
}

func TestJudgeAddr(t *testing.T) {
	for _, tc := range []struct {
		existing, want string
		force          bool
		out            addrAction
	}{
		{"198.18.16.1/24", "198.18.16.1/24", false, addrHave},
		{"198.18.17.1/24", "198.18.16.1/24", false, addrConflict},
		{"198.18.17.1/24", "198.18.16.1/24", true, addrReplace},
		{"fd20::1/64", "198.18.16.1/24", false, addrKeep},
		{"fd20:1::1/64", "fd20:2::1/64", false, addrKeep},
		{"fd20:1::2/64", "fd20:1::1/64", false, addrConflict},
		{"fd20:1::2/64", "fd20:1::1/64", true, addrReplace},
		{"fe80::1/64", "fd20:1::1/64", false, addrKeep},
	} {
		if got := judgeAddr(mustCIDR(tc.existing), mustCIDR(tc.want), tc.force); got != tc.out {
			t.Errorf("existing %s, want %s, force %v: %v, want %v", tc.existing, tc.want, tc.force, got, tc.out)
		}
	}
}

func strs(ns []net.IPNet) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.String())
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
