package fwfake

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// setRule matches destinations in set name.
func setRule(chain, name string) ruleset.Rule {
	return ruleset.Rule{Chain: chain, Match: []ruleset.Match{{Kind: ruleset.MatchDstSet, Name: name}}, Target: ruleset.Target{Kind: ruleset.Accept}}
}

// TestIPSets: with an iptables backend, a rule needs its ipset there and
// keeps it from going; elements are added once (their comment replaced)
// and a removal of what is not there is no error; the ipsets are read back
// and in the dump; and a firewall of native nftables has no ipsets.
func TestIPSets(t *testing.T) {
	ctx := context.Background()
	in4 := ruleset.IPSets(ruleset.V4)
	s := ruleset.Set{Name: "probes-v4", Family: ruleset.V4}
	a, b := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.6")
	for _, be := range []string{"legacy", "nft"} {
		t.Run(be, func(t *testing.T) {
			f := New(map[string]firewall.Backend{"legacy": legacy, "nft": iptNFT}[be])
			rule := (&ruleset.Tx{}).AddChain(nat, ruleset.Chain{Name: "X"}).AddRule(nat, setRule("X", s.Name))
			if err := f.Apply(ctx, rule); !errors.Is(err, unix.ENOENT) {
				t.Fatalf("a rule matching a set that is not there: %v", err)
			}
			tx := (&ruleset.Tx{}).AddSet(in4, s).AddElements(in4, s, ruleset.Element{Addr: a, Comment: "old"}, ruleset.Element{Addr: a, Comment: "uid-a"})
			tx.Append(rule)
			if err := f.Apply(ctx, tx); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(f.Ops(), "|"); got != "ipset, restore v4" {
				t.Fatalf("routes %q", got)
			}
			if err := f.Apply(ctx, (&ruleset.Tx{}).DestroySet(in4, s)); !errors.Is(err, unix.EBUSY) {
				t.Fatalf("a set in use destroyed: %v", err)
			}
			if err := f.Apply(ctx, (&ruleset.Tx{}).AddSet(in4, s).AddElements(in4, s, ruleset.Element{Addr: b}).DestroyElements(in4, s, ruleset.Element{Addr: netip.MustParseAddr("10.0.0.9")})); err != nil {
				t.Fatal(err)
			}
			got := f.Set(in4, s.Name)
			if got == nil || len(got.Elements) != 2 || got.Elements[0] != (ruleset.Element{Addr: a, Comment: "uid-a"}) || !got.Has(b) {
				t.Fatalf("set %+v", got)
			}
			if !strings.Contains(f.Dump(), `ipset probes-v4 { 10.0.0.5 "uid-a" 10.0.0.6 }`) {
				t.Fatalf("dump:\n%s", f.Dump())
			}
			clean := (&ruleset.Tx{}).FlushChain(nat, "X").DeleteChain(nat, "X").DestroySet(in4, s).DestroySet(in4, s)
			if err := f.Apply(ctx, clean); err != nil || f.Set(in4, s.Name) != nil || len(f.IPSets()) != 0 {
				t.Fatalf("removed: %v, %v", err, f.IPSets())
			}
		})
	}
	if err := New(nft).Apply(ctx, (&ruleset.Tx{}).AddSet(in4, s)); err == nil {
		t.Fatal("an ipset on a native nftables firewall")
	}
}

// TestNftSets: a native table's sets, declared with it (a declaration
// keeps the elements), filled and emptied; a removal of elements of a set
// or table not there is no error (the Host removes only what is there),
// a flush of a set not there is; a rule needs its set.
func TestNftSets(t *testing.T) {
	ctx := context.Background()
	host := ruleset.TableID{Family: ruleset.Inet, Name: "istio-ambient-nat"}
	s := ruleset.Set{Name: "probes-v4", Family: ruleset.V4}
	a := ruleset.Element{Addr: netip.MustParseAddr("10.0.0.5")}
	f := New(nft)
	def := ruleset.Table{Family: host.Family, Name: host.Name, Sets: []ruleset.Set{s},
		Chains: []ruleset.Chain{{Name: "post", Rules: []ruleset.Rule{setRule("post", s.Name)}}}}
	if err := f.Apply(ctx, (&ruleset.Tx{}).AddTable(def).AddElements(host, s, a)); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(ctx, (&ruleset.Tx{}).AddTable(ruleset.Table{Family: host.Family, Name: host.Name, Sets: []ruleset.Set{s}})); err != nil || !f.Set(host, s.Name).Has(a.Addr) {
		t.Fatalf("a declaration emptied the set: %v %+v", err, f.Set(host, s.Name))
	}
	if err := f.Apply(ctx, (&ruleset.Tx{}).AddRule(host, setRule("post", "other"))); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("a rule matching a set not there: %v", err)
	}
	other := ruleset.TableID{Family: ruleset.Inet, Name: "none"}
	if err := f.Apply(ctx, (&ruleset.Tx{}).DestroyElements(other, s, a).DestroyElements(host, ruleset.Set{Name: "none", Family: ruleset.V4}, a)); err != nil {
		t.Fatalf("a removal of what is not there: %v", err)
	}
	if err := f.Apply(ctx, (&ruleset.Tx{}).FlushSet(other, s)); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("a flush of a set not there: %v", err)
	}
	if err := f.Apply(ctx, (&ruleset.Tx{}).FlushSet(host, s)); err != nil || f.Set(host, s.Name).Has(a.Addr) {
		t.Fatalf("flush: %v %+v", err, f.Set(host, s.Name))
	}
	if err := f.Apply(ctx, (&ruleset.Tx{}).DestroyTable(host)); err != nil || f.Set(host, s.Name) != nil {
		t.Fatalf("the table's sets stayed: %v", err)
	}
}
