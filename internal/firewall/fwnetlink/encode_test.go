package fwnetlink

import (
	"bytes"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// TestEncodeMasqueradeRule: a typed masquerade rule is encoded as the
// expressions of its iptables-restore line (nftnl's tests check those
// against iptables-nft), and a read of it gives back what iptables-save
// prints for that line.
func TestEncodeMasqueradeRule(t *testing.T) {
	for _, c := range []struct {
		f        ruleset.IPVersion
		src, dst string
		notSrc   bool
	}{
		{ruleset.V4, "198.18.16.5/32", "198.18.16.0/24", false},
		{ruleset.V4, "198.18.16.5/32", "198.18.16.4/30", false},
		{ruleset.V4, "198.18.16.0/20", "198.18.0.0/16", true},
		{ruleset.V6, "fd20::5/128", "fd20::/64", false},
		{ruleset.V6, "fd20::5/128", "fd20:0:0:ab80::/57", false},
	} {
		r := ruleset.Rule{
			Family: c.f, Chain: "POSTROUTING",
			Match: []ruleset.Match{
				{Kind: ruleset.MatchSrc, Not: c.notSrc, Prefix: netip.MustParsePrefix(c.src)},
				{Kind: ruleset.MatchDst, Not: true, Prefix: netip.MustParsePrefix(c.dst)},
				{Kind: ruleset.MatchDstType, Not: true, Name: "MULTICAST"},
			},
			Comment: "meshwire-masq MW-x net=n",
			Target:  ruleset.Target{Kind: ruleset.Masquerade},
		}
		nr, err := encodeRule("nat", r)
		if err != nil {
			t.Fatal(err)
		}
		_, src, _ := net.ParseCIDR(c.src)
		_, dst, _ := net.ParseCIDR(c.dst)
		cm, _ := nftnl.Comment(r.Comment)
		f := c.f.Tables()
		want := append(nftnl.AddrMatch(f, false, c.notSrc, *src), nftnl.AddrMatch(f, true, true, *dst)...)
		want = append(want, nftnl.NotMulticastDst(), cm, nftnl.Counter(), nftnl.Masquerade(f))
		if nr.Family != f || nr.Table != "nat" || nr.Chain != "POSTROUTING" || !bytes.Equal(nftnl.EncodeExprs(nr.Exprs), nftnl.EncodeExprs(want)) {
			t.Errorf("%s %s: encoded otherwise than the line's expressions", c.src, c.dst)
		}
		read, _ := fwtext.ParseIPTablesRule(c.f, "nat", "-A POSTROUTING "+fwtext.IPTablesSpec(r))
		read.Spec = ""
		if got := decodeAppended(nr); got != read {
			t.Errorf("decoded back as\n%+v\nwant what iptables-save's line reads as\n%+v", got, read)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	masq := ruleset.Target{Kind: ruleset.Masquerade}
	src := ruleset.Match{Kind: ruleset.MatchSrc, Prefix: netip.MustParsePrefix("198.18.0.1/32")}
	base := ruleset.Rule{Family: ruleset.V4, Chain: "POSTROUTING", Match: []ruleset.Match{src}, Target: masq}
	with := func(f func(*ruleset.Rule)) ruleset.Rule {
		x := base
		x.Match = slices.Clone(base.Match)
		f(&x)
		return x
	}
	for name, r := range map[string]ruleset.Rule{
		"no family": with(func(x *ruleset.Rule) { x.Family = 0 }),
		"port": with(func(x *ruleset.Rule) {
			x.Match = append(x.Match, ruleset.Match{Kind: ruleset.MatchDPort, Name: "tcp", Ports: []uint16{80}})
		}),
		"other target": with(func(x *ruleset.Rule) { x.Target = ruleset.Target{Kind: ruleset.Redirect, Port: 80} }),
		"jump":         with(func(x *ruleset.Rule) { x.Target = ruleset.Target{Kind: ruleset.Jump, Chain: "X"} }),
		"v6 in ip":     with(func(x *ruleset.Rule) { x.Match[0].Prefix = netip.MustParsePrefix("fd20::1/128") }),
		"long comment": with(func(x *ruleset.Rule) { x.Comment = string(make([]byte, 300)) }),
		"4in6 address": with(func(x *ruleset.Rule) { x.Match[0].Prefix = netip.MustParsePrefix("::ffff:198.18.0.1/128") }),
		"interface in": with(func(x *ruleset.Rule) { x.Match = append(x.Match, ruleset.Match{Kind: ruleset.MatchIn, Name: "eth0"}) }),
		"mark":         with(func(x *ruleset.Rule) { x.Match = append(x.Match, ruleset.Match{Kind: ruleset.MatchMark, Value: 1}) }),
		"local type": with(func(x *ruleset.Rule) {
			x.Match = append(x.Match, ruleset.Match{Kind: ruleset.MatchDstType, Not: true, Name: "LOCAL"})
		}),
		"out of order": with(func(x *ruleset.Rule) {
			x.Match = append([]ruleset.Match{{Kind: ruleset.MatchDst, Prefix: src.Prefix}}, x.Match...)
		}),
	} {
		if _, err := encodeRule("nat", r); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
	if _, err := encodeRule("nat", base); err != nil {
		t.Errorf("a plain rule: %v", err)
	}
}

// decodeAppended reads an encoded rule the way a netlink read would.
func decodeAppended(nr nftnl.NewRule) installed.Rule {
	r := installed.Rule{Family: nr.Family, Table: nr.Table, Chain: nr.Chain}
	decodeExprs(nftnl.EncodeExprs(nr.Exprs), &r)
	return r
}

// TestCheckTableRefuses: what a table of meshwire's own cannot hold over
// netlink is refused (and Encode leaves such a table to the tool), with
// the rule named.
func TestCheckTableRefuses(t *testing.T) {
	base := ruleset.Table{Family: ruleset.Inet, Name: "mw-t", Chains: []ruleset.Chain{{Name: "postrouting",
		Base: &ruleset.BaseChain{Type: "nat", Hook: "postrouting", Priority: 100}}}}
	masq := ruleset.Target{Kind: ruleset.Masquerade}
	for name, tc := range map[string]struct {
		rules []ruleset.Rule
		hook  string
		want  string
	}{
		"redirect target":              {[]ruleset.Rule{{Target: ruleset.Target{Kind: ruleset.Redirect, Port: 15001}}}, "", "target of kind"},
		"IPv6 address in an IPv4 rule": {[]ruleset.Rule{{Family: ruleset.V4, Match: []ruleset.Match{{Kind: ruleset.MatchSrc, Prefix: netip.MustParsePrefix("fd00::1/128")}}, Target: masq}}, "", "in an IPv4 rule"},
		"MAC outside a bridge table":   {[]ruleset.Rule{{Match: []ruleset.Match{{Kind: ruleset.MatchEtherSrc, Name: "02:00:00:00:00:01"}}, Target: masq}}, "", "in a bridge table"},
		"uid match":                    {[]ruleset.Rule{{Match: []ruleset.Match{{Kind: ruleset.MatchUID, Value: 1337}}, Target: masq}}, "", "not written over netlink"},
		"unknown hook":                 {nil, "egress", "on hook"},
	} {
		t.Run(name, func(t *testing.T) {
			tb := base
			c := tb.Chains[0]
			c.Rules = tc.rules
			if tc.hook != "" {
				c.Base = &ruleset.BaseChain{Type: "nat", Hook: tc.hook}
			}
			tb.Chains = []ruleset.Chain{c}
			_, _, err := CheckTable(tb)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
			if _, ok := Encode((&ruleset.Tx{}).ReplaceTable(tb), false); ok {
				t.Fatal("Encode took a table it cannot write")
			}
		})
	}
}
