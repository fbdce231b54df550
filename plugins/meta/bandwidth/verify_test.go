package main

import (
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/attachment"
)

func TestVerify(t *testing.T) {
	const tick, mtu = 15.625, 1500
	tags := attachment.NetworkTags("n")
	tag := tags[0]
	bw := Bandwidth{Ingress: Limit{10_000_000, 100_000}, Egress: Limit{20_000_000, 200_000}}
	tbf := func(l Limit) *netlink.Tbf {
		p := tbfFor(l, mtu, tick)
		return &netlink.Tbf{Rate: p.Rate, Buffer: p.Buffer, Limit: p.Limit}
	}
	good := func() observed {
		return observed{Dev: "veth0", RootTbf: tbf(bw.Ingress), IfbName: "mwbwx", Ifb: true, IfbUp: true,
			IfbAlias: ifbInfo{Net: tag}.alias(), IfbTbf: tbf(bw.Egress), Redirect: true}
	}
	cases := []struct {
		name   string
		bw     Bandwidth
		change func(*observed)
		want   string // "" = passes
	}{
		{"as configured", bw, func(*observed) {}, ""},
		{"ingress rate changed", bw, func(o *observed) { o.RootTbf.Rate++ }, "ingress: veth0 rate"},
		{"egress rate changed", bw, func(o *observed) { o.IfbTbf.Rate-- }, "egress: mwbwx rate"},
		{"burst changed", bw, func(o *observed) { o.IfbTbf.Buffer *= 2 }, "bucket"},
		{"queue changed", bw, func(o *observed) { o.RootTbf.Limit = 1 }, "queue limit"},
		{"no ingress tbf", bw, func(o *observed) { o.RootTbf = nil }, "ingress: no meshwire tbf"},
		{"no ifb", bw, func(o *observed) { o.Ifb = false }, "missing"},
		{"ifb down", bw, func(o *observed) { o.IfbUp = false }, "down"},
		{"ifb of another network", bw, func(o *observed) { o.IfbAlias = ifbInfo{Net: attachment.NetworkTag("other")}.alias() }, "network"},
		{"ifb of another network, older tag", bw, func(o *observed) { o.IfbAlias = ifbInfo{Net: attachment.LegacyBandwidthNetworkTag("other")}.alias() }, "network"},
		{"ifb made by an older meshwire", bw, func(o *observed) { o.IfbAlias = ifbInfo{Net: tags[1]}.alias() }, ""},
		{"no redirect", bw, func(o *observed) { o.Redirect = false }, "redirect"},
		{"no ifb tbf", bw, func(o *observed) { o.IfbTbf = nil }, "egress: no meshwire tbf"},
		{"ingress only", Bandwidth{Ingress: bw.Ingress}, func(o *observed) { *o = observed{Dev: "veth0", RootTbf: tbf(bw.Ingress)} }, ""},
		{"ingress only but an ifb", Bandwidth{Ingress: bw.Ingress}, func(*observed) {}, "does not limit egress"},
		{"egress only but a root tbf", Bandwidth{Egress: bw.Egress}, func(*observed) {}, "does not limit ingress"},
		{"nothing shaped, nothing there", Bandwidth{}, func(o *observed) { *o = observed{Dev: "veth0"} }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := good()
			c.change(&o)
			err := verify(c.bw, mtu, tick, tags, o)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}
