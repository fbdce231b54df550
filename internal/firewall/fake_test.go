package firewall

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/ruleset"
)

func TestFakeRestore(t *testing.T) {
	ctx := context.Background()
	f := NewFake(Backend{Kind: IPTables, Variant: VariantLegacy})
	add := "*nat\n-N MWHP-1\n-A MWHP-1 -m comment --comment \"tag x\"\n-A MWHP-1 -d 10.0.0.1/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.1.0.2:80\n-A PREROUTING -m addrtype --dst-type LOCAL -j MWHP-1\nCOMMIT\n"
	if err := f.Restore(ctx, V4, add); err != nil {
		t.Fatal(err)
	}
	if err := f.Restore(ctx, V4, add); err == nil {
		t.Fatal("-N of an existing chain accepted")
	}
	c, _ := f.ReadChain(ctx, IP, "nat", "MWHP-1")
	if c == nil || len(c.Rules) != 2 {
		t.Fatalf("chain %+v", c)
	}
	r := c.Rules[1]
	if r.Proto != "tcp" || r.DPort != 8080 || r.Dst != netip.MustParsePrefix("10.0.0.1/32") || r.Target != "DNAT" ||
		r.ToDest != netip.MustParseAddrPort("10.1.0.2:80") || r.Position != 2 || r.Handle != 0 {
		t.Fatalf("rule %+v", r)
	}
	if c.Rules[0].Comment != "tag x" {
		t.Fatalf("comment %q", c.Rules[0].Comment)
	}
	pre, _ := f.ReadChain(ctx, IP, "nat", "PREROUTING")
	if len(pre.Rules) != 1 || pre.Rules[0].Jump != "MWHP-1" || !pre.Rules[0].DstLocal {
		t.Fatalf("PREROUTING %+v", pre)
	}
	if err := f.Restore(ctx, V4, "*nat\n-X MWHP-1\nCOMMIT\n"); err == nil {
		t.Fatal("-X of a referenced, non-empty chain accepted")
	}
	// All or nothing: the failing -D leaves the -F undone.
	if err := f.Restore(ctx, V4, "*nat\n-F MWHP-1\n-D PREROUTING -j MWHP-2\nCOMMIT\n"); err == nil {
		t.Fatal("-D of a missing rule accepted")
	}
	if c, _ := f.ReadChain(ctx, IP, "nat", "MWHP-1"); len(c.Rules) != 2 {
		t.Fatal("a failed transaction changed the ruleset")
	}
	if err := f.DeleteRules(ctx, pre.Rules); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteRules(ctx, pre.Rules); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if err := f.Restore(ctx, V4, "*nat\n-F MWHP-1\n-X MWHP-1\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.Dump(), "*nat\n:PREROUTING ACCEPT\n") {
		t.Fatalf("dump:\n%s", f.Dump())
	}
}

func TestFakeNft(t *testing.T) {
	ctx := context.Background()
	f := NewFake(Backend{Kind: NFTables})
	script := `add table inet t1
delete table inet t1
table inet t1 {
	comment "meshwire-masq x"
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.1.0.2 ip daddr != 10.1.0.0/24 ip daddr != 224.0.0.0/4 masquerade
		ip6 saddr fd00::2 ip6 daddr != fd00::/64 ip6 daddr != ff00::/8 masquerade
	}
}
create chain inet t1 pm-1 { comment "tag"; }
add rule inet t1 pm-1 meta nfproto ipv4 ip saddr != 198.18.49.0/24 tcp dport 30080 dnat ip to 198.18.48.5:80
add rule inet t1 pm-1 meta nfproto ipv6 tcp dport 30080 dnat ip6 to [fd50:48::5]:80
add rule inet t1 postrouting meta mark & 0x00002000 == 0x00002000 masquerade
add rule inet t1 postrouting fib daddr type local jump pm-1
`
	if err := f.ApplyNft(ctx, script); err != nil {
		t.Fatal(err)
	}
	tb := f.Table(Inet, "t1")
	if tb == nil || tb.Comment != "meshwire-masq x" || len(tb.Chains) != 2 {
		t.Fatalf("table %+v", tb)
	}
	post := tb.Chain("postrouting")
	if post.Hook != "postrouting" || len(post.Rules) != 4 {
		t.Fatalf("postrouting %+v", post)
	}
	if r := post.Rules[0]; r.Src != netip.MustParsePrefix("10.1.0.2/32") || !r.NotDst || r.Target != "MASQUERADE" || r.IPFamily != V4 {
		t.Fatalf("masquerade rule %+v", r)
	}
	if r := post.Rules[2]; !r.HasMark || r.Mark != 0x2000 || r.MarkMask != 0x2000 {
		t.Fatalf("mark rule %+v", r)
	}
	if r := post.Rules[3]; !r.DstLocal || r.Jump != "pm-1" || r.Handle == 0 {
		t.Fatalf("jump rule %+v", r)
	}
	pm := tb.Chain("pm-1")
	if pm.Comment != "tag" || pm.Rules[0].ToDest != netip.MustParseAddrPort("198.18.48.5:80") || pm.Rules[1].ToDest != netip.MustParseAddrPort("[fd50:48::5]:80") || pm.Rules[1].IPFamily != V6 {
		t.Fatalf("pm-1 %+v", pm)
	}
	if err := f.ApplyNft(ctx, "delete chain inet t1 pm-1\n"); err == nil {
		t.Fatal("deleting a referenced chain accepted")
	}
	if err := f.ApplyNft(ctx, "create chain inet t1 pm-1\n"); err == nil {
		t.Fatal("create of an existing chain accepted")
	}
	if err := f.ApplyNft(ctx, "delete rule inet t1 postrouting handle 99\n"); err == nil {
		t.Fatal("deleting a missing handle accepted")
	}
	if err := f.DeleteTables(ctx, Inet, []string{"t1", "absent"}); err != nil {
		t.Fatal(err)
	}
	if names, _ := f.Tables(ctx, Inet); len(names) != 0 {
		t.Fatalf("tables left: %v", names)
	}
}

// TestFakeAppend: rules appended as typed values read back (through their
// netlink encoding) as the same typed values as their iptables-restore
// form.
func TestFakeAppend(t *testing.T) {
	ctx := context.Background()
	f := NewFake(Backend{Kind: IPTables, Variant: VariantNFT})
	nr := []ruleset.Rule{{
		Family: V4, Chain: "POSTROUTING",
		Match: []ruleset.Match{
			{Kind: ruleset.MatchSrc, Prefix: netip.MustParsePrefix("10.1.0.2/32")},
			{Kind: ruleset.MatchDst, Not: true, Prefix: netip.MustParsePrefix("10.1.0.0/24")},
			{Kind: ruleset.MatchDstType, Not: true, Name: "MULTICAST"},
		},
		Comment: "meshwire-masq MW-1 net=n", Target: ruleset.Target{Kind: ruleset.Masquerade},
	}}
	if err := f.AppendRules(ctx, "nat", nr); err == nil {
		t.Fatal("append to a missing table accepted")
	}
	if err := f.Restore(ctx, V4, "*nat\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.AppendRules(ctx, "nat", nr); err != nil {
		t.Fatal(err)
	}
	c, _ := f.ReadChain(ctx, IP, "nat", "POSTROUTING")
	if len(c.Rules) != 1 {
		t.Fatalf("chain %+v", c)
	}
	got := c.Rules[0]
	if got.Spec != "" || got.Handle == 0 {
		t.Fatalf("an nf_tables-backed read: %+v", got)
	}
	want, _ := ParseIPTablesRule(V4, "nat", `-A POSTROUTING -s 10.1.0.2/32 ! -d 10.1.0.0/24 -m addrtype ! --dst-type MULTICAST -m comment --comment "meshwire-masq MW-1 net=n" -j MASQUERADE`)
	spec, ok := got.IPTablesSpec()
	if !ok || spec != want.Spec {
		t.Fatalf("spec %q (%v), want %q", spec, ok, want.Spec)
	}
	got.Handle, got.Position, want.Spec = 0, 0, ""
	if got != want {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

// TestFakeChainNames: the Fake lists a table's chains in the kernel's
// order (legacy iptables: built-in chains, then user chains by name;
// nf_tables: as made), and none for a table that is not there.
func TestFakeChainNames(t *testing.T) {
	ctx := context.Background()
	payload := "*nat\n:ZZ - [0:0]\n:AA - [0:0]\nCOMMIT\n"
	for _, c := range []struct {
		b    Backend
		want string
	}{
		{Backend{Kind: IPTables, Variant: VariantLegacy}, "PREROUTING INPUT OUTPUT POSTROUTING AA ZZ"},
		{Backend{Kind: IPTables, Variant: VariantNFT}, "PREROUTING INPUT OUTPUT POSTROUTING ZZ AA"},
	} {
		f := NewFake(c.b)
		if got, err := f.ChainNames(ctx, IP, "nat"); got != nil || err != nil {
			t.Fatalf("%s before: %v, %v", c.b, got, err)
		}
		if err := f.Restore(ctx, V4, payload); err != nil {
			t.Fatal(err)
		}
		if got, _ := f.ChainNames(ctx, IP, "nat"); strings.Join(got, " ") != c.want {
			t.Errorf("%s: %v, want %s", c.b, got, c.want)
		}
		if got, _ := f.ChainNames(ctx, IP6, "nat"); got != nil {
			t.Errorf("%s IPv6: %v", c.b, got)
		}
	}
	f := NewFake(Backend{Kind: NFTables})
	if err := f.ApplyNft(ctx, "table inet t {\n\tchain b {\n\t}\n\tchain a {\n\t}\n}\n"); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.ChainNames(ctx, Inet, "t"); strings.Join(got, " ") != "b a" {
		t.Errorf("nftables: %v", got)
	}
}

// TestReplaceTableRefuses: what a table of meshwire's own cannot hold
// over netlink is refused before anything is written, with the rule named.
func TestReplaceTableRefuses(t *testing.T) {
	base := ruleset.Table{Family: Inet, Name: "mw-t", Chain: ruleset.BaseChain{Name: "postrouting", Type: "nat", Hook: "postrouting", Priority: 100}}
	masq := ruleset.Target{Kind: ruleset.Masquerade}
	for name, tc := range map[string]struct {
		mod  func(*ruleset.Table)
		want string
	}{
		"redirect target": {func(t *ruleset.Table) {
			t.Rules = []ruleset.Rule{{Target: ruleset.Target{Kind: ruleset.Redirect, Port: 15001}}}
		}, "target of kind"},
		"IPv6 address in an IPv4 rule": {func(t *ruleset.Table) {
			t.Rules = []ruleset.Rule{{Family: ruleset.V4, Match: []ruleset.Match{{Kind: ruleset.MatchSrc, Prefix: netip.MustParsePrefix("fd00::1/128")}}, Target: masq}}
		}, "in an IPv4 rule"},
		"MAC outside a bridge table": {func(t *ruleset.Table) {
			t.Rules = []ruleset.Rule{{Match: []ruleset.Match{{Kind: ruleset.MatchEtherSrc, Name: "02:00:00:00:00:01"}}, Target: masq}}
		}, "in a bridge table"},
		"uid match": {func(t *ruleset.Table) {
			t.Rules = []ruleset.Rule{{Match: []ruleset.Match{{Kind: ruleset.MatchUID, Value: 1337}}, Target: masq}}
		}, "not written over netlink"},
		"unknown hook": {func(t *ruleset.Table) { t.Chain.Hook = "egress" }, "on hook"},
	} {
		t.Run(name, func(t *testing.T) {
			tb := base
			tc.mod(&tb)
			f := NewFake(Backend{Kind: NFTables})
			err := f.ReplaceTable(context.Background(), tb)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
			if len(f.Ops()) != 0 {
				t.Fatalf("a refused table wrote: %v", f.Ops())
			}
		})
	}
}
