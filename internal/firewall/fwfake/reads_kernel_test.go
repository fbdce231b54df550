//go:build kernel

package fwfake

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// TestReadsMatchTheFake: a transaction applied to the kernel and read
// back over netlink gives the typed rules the Fake reads after applying
// the same transaction (the decoder and the Fake's model agree), for
// native tables and for iptables-nft rules.
func TestReadsMatchTheFake(t *testing.T) {
	kerneltest.Require(t)
	_, p := kerneltest.NewNS(t, "fwdec")
	ctx := context.Background()
	pfx := netip.MustParsePrefix
	ap := netip.MustParseAddrPort
	dport := func(proto string, port uint16, not bool) ruleset.Match {
		return ruleset.Match{Kind: ruleset.MatchDPort, Name: proto, Ports: []uint16{port}, Not: not}
	}
	jump := func(c string) ruleset.Target { return ruleset.Target{Kind: ruleset.Jump, Chain: c} }
	local := ruleset.Match{Kind: ruleset.MatchDstType, Name: "LOCAL"}
	native := (&ruleset.Tx{}).AddTable(ruleset.Table{Family: ruleset.Inet, Name: "mwt", Comment: "a table", Chains: []ruleset.Chain{
		{Name: "pm-1", Comment: "an attachment", Rules: []ruleset.Rule{
			{Match: []ruleset.Match{{Kind: ruleset.MatchNfproto, Name: "ipv4"}, {Kind: ruleset.MatchSrc, Not: true, Prefix: pfx("198.18.49.0/24")}, dport("tcp", 30080, false)},
				Target: ruleset.Target{Kind: ruleset.DNAT, To: ap("198.18.48.5:80")}},
			{Match: []ruleset.Match{{Kind: ruleset.MatchNfproto, Name: "ipv6"}, {Kind: ruleset.MatchDst, Prefix: pfx("fd50:48::1/128"), Host: true}, dport("tcp", 30080, false)},
				Target: ruleset.Target{Kind: ruleset.DNAT, To: ap("[fd50:48::5]:80")}},
		}},
		{Name: "prerouting", Base: &ruleset.BaseChain{Type: "nat", Hook: "prerouting", Priority: -100, PriorityName: "dstnat"},
			Rules: []ruleset.Rule{{Match: []ruleset.Match{local}, Target: jump("pm-1")}}},
		{Name: "postrouting", Base: &ruleset.BaseChain{Type: "nat", Hook: "postrouting", Priority: 100, PriorityName: "srcnat"},
			Rules: []ruleset.Rule{{Match: []ruleset.Match{{Kind: ruleset.MatchMark, Value: 0x2000, Mask: 0x2000}}, Target: ruleset.Target{Kind: ruleset.Masquerade}}}},
		{Name: "mangle", Base: &ruleset.BaseChain{Type: "filter", Hook: "prerouting", Priority: -150},
			Rules: []ruleset.Rule{{Family: ruleset.V4, Match: []ruleset.Match{{Kind: ruleset.MatchProto, Name: "tcp"}, {Kind: ruleset.MatchIn, Name: "eth0"}},
				Target: ruleset.Target{Kind: ruleset.TProxy, Port: 15006, Mark: 1}}}},
	}}).AddTable(ruleset.Table{Family: ruleset.IP, Name: "mwt", Chains: []ruleset.Chain{
		{Name: "nat_output", Base: &ruleset.BaseChain{Type: "nat", Hook: "output", Priority: -100}, Rules: []ruleset.Rule{
			{Match: []ruleset.Match{{Kind: ruleset.MatchDst, Prefix: pfx("10.0.0.0/8")}}, Target: ruleset.Target{Kind: ruleset.Return}},
			{Match: []ruleset.Match{dport("tcp", 22, true)}, Target: ruleset.Target{Kind: ruleset.Redirect, Port: 15001}},
		}},
	}})
	nat := ruleset.TableID{Family: ruleset.IP, Name: "nat"}
	ipt := (&ruleset.Tx{}).AddChain(nat, ruleset.Chain{Name: "MWT"}).
		AddRule(nat, ruleset.Rule{Chain: "POSTROUTING", Match: []ruleset.Match{{Kind: ruleset.MatchSrc, Prefix: pfx("10.1.0.2/32")},
			{Kind: ruleset.MatchDst, Not: true, Prefix: pfx("10.1.0.0/24")}}, Comment: "hello world", Target: ruleset.Target{Kind: ruleset.Masquerade}}).
		AddRule(nat, ruleset.Rule{Chain: "PREROUTING", Match: []ruleset.Match{local}, Target: jump("MWT")}).
		AddRule(nat, ruleset.Rule{Chain: "MWT", Match: []ruleset.Match{{Kind: ruleset.MatchDst, Prefix: pfx("10.0.0.1/32")}, dport("tcp", 8080, false)},
			Target: ruleset.Target{Kind: ruleset.DNAT, To: ap("10.1.0.2:80")}})
	nftB := firewall.Backend{Kind: firewall.NFTables}
	iptB := firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT}
	fake, fakeIPT := New(nftB), New(iptB)
	if err := fake.Apply(ctx, native); err != nil {
		t.Fatal(err)
	}
	if err := fakeIPT.Apply(ctx, ipt); err != nil {
		t.Fatal(err)
	}
	err := netns.Enter(p, func() error {
		h := firewall.New(nftB)
		defer h.Close()
		if err := h.Apply(ctx, native); err != nil {
			return err
		}
		if err := firewall.New(iptB).Apply(ctx, ipt); err != nil {
			return err
		}
		for _, c := range []struct {
			fam   ruleset.Family
			table string
			fake  *Fake
		}{{ruleset.Inet, "mwt", fake}, {ruleset.IP, "mwt", fake}, {ruleset.IP, "nat", fakeIPT}} {
			got, err := h.ReadTable(ctx, c.fam, c.table)
			if err != nil {
				return err
			}
			want := c.fake.Table(c.fam, c.table)
			if got == nil || got.Comment != want.Comment {
				return fmt.Errorf("%s %s: table %+v, want %+v", c.fam.Name(), c.table, got, want)
			}
			for _, wc := range want.Chains {
				gc := got.Chain(wc.Name)
				if gc == nil && wc.Hook != "" && len(wc.Rules) == 0 {
					continue // iptables-nft makes built-in chains when used
				}
				if gc == nil || gc.Comment != wc.Comment || gc.Hook != wc.Hook || len(gc.Rules) != len(wc.Rules) {
					return fmt.Errorf("chain %s: %+v, want %+v", wc.Name, gc, wc)
				}
				for i, wr := range wc.Rules {
					gr := gc.Rules[i]
					if gr.Handle == 0 {
						return fmt.Errorf("rule without a handle: %+v", gr)
					}
					gr.Handle, wr.Handle = 0, 0
					if gr != wr {
						return fmt.Errorf("chain %s rule %d:\n got %+v\nwant %+v", wc.Name, i+1, gr, wr)
					}
				}
			}
			names, err := h.ChainNames(ctx, c.fam, c.table)
			fakeNames, _ := c.fake.ChainNames(ctx, c.fam, c.table)
			for _, n := range fakeNames {
				if !slices.Contains(names, n) && (want.Chain(n).Hook == "" || len(want.Chain(n).Rules) > 0) {
					return fmt.Errorf("ChainNames %s %s = %v, %v; the Fake has %v", c.fam.Name(), c.table, names, err, fakeNames)
				}
			}
			if c.table == "mwt" && !slices.Equal(names, fakeNames) {
				return fmt.Errorf("ChainNames %s %s = %v, the Fake has %v", c.fam.Name(), c.table, names, fakeNames)
			}
			one, err := h.ReadChain(ctx, c.fam, c.table, want.Chains[0].Name)
			if err != nil || one == nil || len(one.Rules) != len(want.Chains[0].Rules) {
				return fmt.Errorf("ReadChain: %+v, %v", one, err)
			}
		}
		if ok, err := h.HasChain(ctx, ruleset.IP, "nat", "MWT"); !ok || err != nil {
			return fmt.Errorf("HasChain = %v, %v", ok, err)
		}
		if c, err := h.ReadChain(ctx, ruleset.IP, "nat", "ABSENT"); c != nil || err != nil {
			return fmt.Errorf("ReadChain of an absent chain = %+v, %v", c, err)
		}
		if names, err := h.ChainNames(ctx, ruleset.Inet, "absent"); names != nil || err != nil {
			return fmt.Errorf("ChainNames of an absent table = %v, %v", names, err)
		}
		if ok, err := h.HasTable(ctx, ruleset.Inet, "absent"); ok || err != nil {
			return fmt.Errorf("HasTable of an absent table = %v, %v", ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
