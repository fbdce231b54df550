package main

import (
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
)

func TestVerify(t *testing.T) {
	v4 := &net.IPNet{IP: net.IPv4(127, 0, 0, 1), Mask: net.CIDRMask(8, 32)}
	cases := []struct {
		st   loState
		want string
	}{
		{loState{up: true, v4: v4}, ""},
		{loState{up: false, v4: v4}, "lo is down"},
		{loState{up: true}, "no address 127.0.0.1"},
		{loState{up: true, v4: &net.IPNet{IP: net.IPv4(127, 0, 0, 2), Mask: net.CIDRMask(8, 32)}}, "no address 127.0.0.1"},
	}
	for _, c := range cases {
		err := verify("lo", c.st)
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("verify(%+v) = %v, want %q", c.st, err, c.want)
		}
	}
}

func TestBuildResult(t *testing.T) {
	// CNI_IFNAME is ignored: the result names lo, as the reference's does.
	args := &skel.CmdArgs{IfName: "eth0", Netns: "/run/netns/x"}
	v4 := &net.IPNet{IP: net.IPv4(127, 0, 0, 1), Mask: net.CIDRMask(8, 32)}
	r := buildResult(nil, args, loState{up: true, v4: v4}).(*current.Result)
	if r.CNIVersion != current.ImplementedSpecVersion || len(r.IPs) != 1 || *r.IPs[0].Interface != 0 || r.Interfaces[0].Sandbox != "/run/netns/x" {
		t.Fatalf("own result: %+v", r)
	}
	if r.Interfaces[0].Name != "lo" {
		t.Fatalf("result names %q, want lo", r.Interfaces[0].Name)
	}
	prev := &current.Result{CNIVersion: "1.1.0", Interfaces: []*current.Interface{{Name: "eth0"}}}
	if got := buildResult(prev, args, loState{up: true, v4: v4}); got != prev {
		t.Fatalf("chained: got %+v, want prevResult unchanged", got)
	}
}
