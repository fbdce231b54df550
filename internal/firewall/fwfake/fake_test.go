package fwfake

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

var (
	nat    = ruleset.TableID{Family: ruleset.IP, Name: "nat"}
	legacy = firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantLegacy}
	iptNFT = firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT}
	nft    = firewall.Backend{Kind: firewall.NFTables}
)

func jump(chain, to string) ruleset.Rule {
	return ruleset.Rule{Chain: chain, Target: ruleset.Target{Kind: ruleset.Jump, Chain: to}}
}

// dnatRule is -d 10.0.0.1/32 -p tcp -m tcp --dport 8080 -j DNAT
// --to-destination 10.1.0.2:80 in chain.
func dnatRule(chain string) ruleset.Rule {
	return ruleset.Rule{Chain: chain,
		Match: []ruleset.Match{
			{Kind: ruleset.MatchDst, Prefix: netip.MustParsePrefix("10.0.0.1/32")},
			{Kind: ruleset.MatchDPort, Name: "tcp", Ports: []uint16{8080}},
		},
		Target: ruleset.Target{Kind: ruleset.DNAT, To: netip.MustParseAddrPort("10.1.0.2:80")}}
}

// TestIPTables: an iptables transaction, with the kernel's refusals and
// all or nothing; reads of legacy iptables show the rule's text, those of
// iptables-nft its handle.
func TestIPTables(t *testing.T) {
	ctx := context.Background()
	for _, b := range []firewall.Backend{legacy, iptNFT} {
		t.Run(b.String(), func(t *testing.T) {
			f := New(b)
			pre := jump("PREROUTING", "MWHP-1")
			pre.Match = []ruleset.Match{{Kind: ruleset.MatchDstType, Name: "LOCAL"}}
			add := (&ruleset.Tx{}).CreateChain(nat, ruleset.Chain{Name: "MWHP-1"}).
				AddRule(nat, ruleset.Rule{Chain: "MWHP-1", Comment: "tag x", Target: ruleset.Target{Kind: ruleset.None}}).
				AddRule(nat, dnatRule("MWHP-1")).
				AddRule(nat, pre)
			if err := f.Apply(ctx, add); err != nil {
				t.Fatal(err)
			}
			if got := f.Ops(); len(got) != 1 || got[0] != "restore v4" {
				t.Fatalf("routes %v", got)
			}
			if err := f.Apply(ctx, add); !errors.Is(err, unix.EEXIST) {
				t.Fatalf("a second create of the chain: %v", err)
			}
			c, _ := f.ReadChain(ctx, ruleset.IP, "nat", "MWHP-1")
			if c == nil || len(c.Rules) != 2 {
				t.Fatalf("chain %+v", c)
			}
			r := c.Rules[1]
			if r.Proto != "tcp" || r.DPort != 8080 || r.Dst != netip.MustParsePrefix("10.0.0.1/32") || r.Target != "DNAT" ||
				r.ToDest != netip.MustParseAddrPort("10.1.0.2:80") || r.Position != 2 {
				t.Fatalf("rule %+v", r)
			}
			if b == legacy && (r.Handle != 0 || r.Spec != "-d 10.0.0.1/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.1.0.2:80") {
				t.Fatalf("a legacy read: %+v", r)
			}
			if b == iptNFT && (r.Handle == 0 || r.Spec != "") {
				t.Fatalf("an nf_tables read: %+v", r)
			}
			if c.Rules[0].Comment != "tag x" {
				t.Fatalf("comment %q", c.Rules[0].Comment)
			}
			pr, _ := f.ReadChain(ctx, ruleset.IP, "nat", "PREROUTING")
			if len(pr.Rules) != 1 || pr.Rules[0].Jump != "MWHP-1" || !pr.Rules[0].DstLocal {
				t.Fatalf("PREROUTING %+v", pr)
			}
			if err := f.Apply(ctx, (&ruleset.Tx{}).DeleteChain(nat, "MWHP-1")); err == nil {
				t.Fatal("deleting a referenced, non-empty chain accepted")
			}
			// All or nothing: the failing delete leaves the flush undone.
			bad := (&ruleset.Tx{}).FlushChain(nat, "MWHP-1").DeleteRule(nat, jump("PREROUTING", "MWHP-2"))
			if err := f.Apply(ctx, bad); !errors.Is(err, firewall.ErrNotFound) {
				t.Fatalf("deleting a missing rule: %v", err)
			}
			if c, _ := f.ReadChain(ctx, ruleset.IP, "nat", "MWHP-1"); len(c.Rules) != 2 {
				t.Fatal("a failed transaction changed the ruleset")
			}
			if n, err := firewall.DeleteMatching(ctx, f, ruleset.IP, "nat", "PREROUTING", func(installed.Rule) bool { return true }); n != 1 || err != nil {
				t.Fatalf("DeleteMatching = %d, %v", n, err)
			}
			if err := f.Apply(ctx, (&ruleset.Tx{}).DeleteRef(nat, fwtext.Ref(pr.Rules[0]))); !errors.Is(err, firewall.ErrNotFound) {
				t.Fatalf("a second delete: %v", err)
			}
			if err := f.Apply(ctx, (&ruleset.Tx{}).FlushChain(nat, "MWHP-1").DeleteChain(nat, "MWHP-1")); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(f.Dump(), "*nat\n:PREROUTING ACCEPT\n") || strings.Contains(f.Dump(), "MWHP") {
				t.Fatalf("dump:\n%s", f.Dump())
			}
		})
	}
}

// TestNft: native tables, written as blocks and as commands.
func TestNft(t *testing.T) {
	ctx := context.Background()
	f := New(nft)
	t1 := ruleset.TableID{Family: ruleset.Inet, Name: "t1"}
	p := netip.MustParsePrefix
	masq := ruleset.Target{Kind: ruleset.Masquerade}
	tx := (&ruleset.Tx{}).ReplaceTable(ruleset.Table{Family: ruleset.Inet, Name: "t1", Comment: "meshwire-masq x", Chains: []ruleset.Chain{{
		Name: "postrouting", Base: &ruleset.BaseChain{Type: "nat", Hook: "postrouting", Priority: 100, PriorityName: "srcnat"},
		Rules: []ruleset.Rule{
			{Match: []ruleset.Match{{Kind: ruleset.MatchSrc, Prefix: p("10.1.0.2/32"), Host: true}, {Kind: ruleset.MatchDst, Not: true, Prefix: p("10.1.0.0/24")}}, Target: masq},
		},
	}}})
	tx.CreateChain(t1, ruleset.Chain{Name: "pm-1", Comment: "tag"}).
		AddRule(t1, ruleset.Rule{Chain: "pm-1", Match: []ruleset.Match{{Kind: ruleset.MatchNfproto, Name: "ipv4"},
			{Kind: ruleset.MatchRaw, Args: []string{"ip", "saddr", "!=", "198.18.49.0/24"}}, {Kind: ruleset.MatchDPort, Name: "tcp", Ports: []uint16{30080}}},
			Target: ruleset.Target{Kind: ruleset.DNAT, To: netip.MustParseAddrPort("198.18.48.5:80")}}).
		AddRule(t1, ruleset.Rule{Chain: "postrouting", Match: []ruleset.Match{{Kind: ruleset.MatchMark, Value: 0x2000, Mask: 0x2000}}, Target: masq})
	post := jump("postrouting", "pm-1")
	post.Match = []ruleset.Match{{Kind: ruleset.MatchDstType, Name: "LOCAL"}}
	tx.AddRule(t1, post)
	if err := f.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tb := f.Table(ruleset.Inet, "t1")
	if tb == nil || tb.Comment != "meshwire-masq x" || len(tb.Chains) != 2 {
		t.Fatalf("table %+v", tb)
	}
	pc := tb.Chain("postrouting")
	if pc.Hook != "postrouting" || len(pc.Rules) != 3 {
		t.Fatalf("postrouting %+v", pc)
	}
	if r := pc.Rules[0]; r.Src != p("10.1.0.2/32") || !r.NotDst || r.Target != "MASQUERADE" || r.IPFamily != ruleset.V4 || r.Spec != "" {
		t.Fatalf("masquerade rule %+v", r)
	}
	if r := pc.Rules[1]; !r.HasMark || r.Mark != 0x2000 || r.MarkMask != 0x2000 {
		t.Fatalf("mark rule %+v", r)
	}
	if r := pc.Rules[2]; !r.DstLocal || r.Jump != "pm-1" || r.Handle == 0 {
		t.Fatalf("jump rule %+v", r)
	}
	pm := tb.Chain("pm-1")
	if r := pm.Rules[0]; pm.Comment != "tag" || r.ToDest != netip.MustParseAddrPort("198.18.48.5:80") || r.IPFamily != ruleset.V4 || r.Unknown != "raw" {
		t.Fatalf("pm-1 %+v", pm)
	}
	// The user's condition is kept as given.
	if !strings.Contains(f.Dump(), "meta nfproto ipv4 ip saddr != 198.18.49.0/24 tcp dport 30080 dnat ip to 198.18.48.5:80") {
		t.Fatalf("dump:\n%s", f.Dump())
	}
	for what, bad := range map[string]*ruleset.Tx{
		"deleting a referenced chain": (&ruleset.Tx{}).DeleteChain(t1, "pm-1"),
		"creating an existing chain":  (&ruleset.Tx{}).CreateChain(t1, ruleset.Chain{Name: "pm-1"}),
		"deleting a missing handle":   (&ruleset.Tx{}).DeleteRef(t1, ruleset.RuleRef{Chain: "postrouting", Handle: 99}),
		"creating an existing table":  (&ruleset.Tx{}).CreateTable(ruleset.Table{Family: ruleset.Inet, Name: "t1"}),
		"a jump to a missing chain":   (&ruleset.Tx{}).AddRule(t1, jump("pm-1", "absent")),
		"an iptables transaction":     (&ruleset.Tx{}).FlushChain(nat, "POSTROUTING"),
	} {
		if err := f.Apply(ctx, bad); err == nil {
			t.Errorf("%s accepted", what)
		}
	}
	gone := (&ruleset.Tx{}).DestroyTable(t1).DestroyTable(ruleset.TableID{Family: ruleset.Inet, Name: "absent"})
	if err := f.Apply(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if names, _ := f.Tables(ctx, ruleset.Inet); len(names) != 0 {
		t.Fatalf("tables left: %v", names)
	}
	if got := f.Ops(); strings.Join(got, " ") != "nft netlink" {
		t.Fatalf("routes %v", got)
	}
}

// TestAppendOverNetlink: rules appended to an iptables-nft table go over
// netlink once the table is there; before, the tool makes it.
func TestAppendOverNetlink(t *testing.T) {
	ctx := context.Background()
	f := New(iptNFT)
	r := ruleset.Rule{
		Family: ruleset.V4, Chain: "POSTROUTING",
		Match: []ruleset.Match{
			{Kind: ruleset.MatchSrc, Prefix: netip.MustParsePrefix("10.1.0.2/32")},
			{Kind: ruleset.MatchDst, Not: true, Prefix: netip.MustParsePrefix("10.1.0.0/24")},
			{Kind: ruleset.MatchDstType, Not: true, Name: "MULTICAST"},
		},
		Comment: "meshwire-masq MW-1 net=n", Target: ruleset.Target{Kind: ruleset.Masquerade},
	}
	tx := (&ruleset.Tx{}).AddRule(nat, r)
	for i := 0; i < 2; i++ {
		if err := f.Apply(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(f.Ops(), " "); got != "restore v4 netlink" {
		t.Fatalf("routes %s", got)
	}
	c, _ := f.ReadChain(ctx, ruleset.IP, "nat", "POSTROUTING")
	if len(c.Rules) != 2 {
		t.Fatalf("chain %+v", c)
	}
	spec, ok := fwtext.InstalledIPTablesSpec(c.Rules[0])
	if !ok || spec != fwtext.IPTablesSpec(r) {
		t.Fatalf("spec %q (%v), want %q", spec, ok, fwtext.IPTablesSpec(r))
	}
}

// TestChainNames: the Fake lists a table's chains in the kernel's order
// (legacy iptables: built-in chains, then user chains by name; nf_tables:
// as made), and none for a table that is not there.
func TestChainNames(t *testing.T) {
	ctx := context.Background()
	tx := (&ruleset.Tx{}).AddChain(nat, ruleset.Chain{Name: "ZZ"}).AddChain(nat, ruleset.Chain{Name: "AA"})
	for _, c := range []struct {
		b    firewall.Backend
		want string
	}{
		{legacy, "PREROUTING INPUT OUTPUT POSTROUTING AA ZZ"},
		{iptNFT, "PREROUTING INPUT OUTPUT POSTROUTING ZZ AA"},
	} {
		f := New(c.b)
		if got, err := f.ChainNames(ctx, ruleset.IP, "nat"); got != nil || err != nil {
			t.Fatalf("%s before: %v, %v", c.b, got, err)
		}
		if err := f.Apply(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if got, _ := f.ChainNames(ctx, ruleset.IP, "nat"); strings.Join(got, " ") != c.want {
			t.Errorf("%s: %v, want %s", c.b, got, c.want)
		}
		if got, _ := f.ChainNames(ctx, ruleset.IP6, "nat"); got != nil {
			t.Errorf("%s IPv6: %v", c.b, got)
		}
	}
	f := New(nft)
	if err := f.Apply(ctx, (&ruleset.Tx{}).AddTable(ruleset.Table{Family: ruleset.Inet, Name: "t", Chains: []ruleset.Chain{{Name: "b"}, {Name: "a"}}})); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.ChainNames(ctx, ruleset.Inet, "t"); strings.Join(got, " ") != "b a" {
		t.Errorf("nftables: %v", got)
	}
}

// TestFail: a transaction the hook refuses changes nothing.
func TestFail(t *testing.T) {
	f := New(nft)
	f.Fail = func(route string) error { return errors.New("refused " + route) }
	err := f.Apply(context.Background(), (&ruleset.Tx{}).AddTable(ruleset.Table{Family: ruleset.Inet, Name: "t"}))
	if err == nil || err.Error() != "refused nft" || len(f.Ops()) != 0 || f.Dump() != "" {
		t.Fatalf("err %v, ops %v, dump %q", err, f.Ops(), f.Dump())
	}
}
