//go:build kernel

package fwfake

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// TestSetsMatchTheFake: set and element operations applied to the
// kernel through the Host (ipsets over netlink with the iptables
// backends, sets of a native table with nftables) read back as the Fake
// reads them after the same transactions: elements added twice are there
// once, a removal of what is not there (an element, a set) is no error,
// and a set goes once its rule is gone.
func TestSetsMatchTheFake(t *testing.T) {
	kerneltest.Require(t)
	ctx := context.Background()
	a, b := netip.MustParseAddr("198.18.60.5"), netip.MustParseAddr("198.18.60.6")
	six := netip.MustParseAddr("fd50:60::5")
	for _, be := range []firewall.Backend{
		{Kind: firewall.IPTables, Variant: firewall.VariantLegacy},
		{Kind: firewall.IPTables, Variant: firewall.VariantNFT},
		{Kind: firewall.NFTables},
	} {
		t.Run(be.String(), func(t *testing.T) {
			_, p := kerneltest.NewNS(t, "fwsets")
			native := be.Kind == firewall.NFTables
			v4, v6 := ruleset.Set{Name: "mwt-v4", Family: ruleset.V4}, ruleset.Set{Name: "mwt-v6", Family: ruleset.V6}
			where := func(s ruleset.Set) ruleset.TableID {
				if native {
					return ruleset.TableID{Family: ruleset.Inet, Name: "mwt"}
				}
				return ruleset.IPSets(s.Family)
			}
			rule := func(s ruleset.Set) ruleset.Rule {
				return ruleset.Rule{Family: s.Family, Chain: "MWT", Match: []ruleset.Match{{Kind: ruleset.MatchProto, Name: "tcp"}, {Kind: ruleset.MatchDstSet, Name: s.Name}},
					Target: ruleset.Target{Kind: ruleset.Accept}}
			}
			var owned ruleset.Owned
			build := &ruleset.Tx{}
			if native {
				build.AddTable(ruleset.Table{Family: ruleset.Inet, Name: "mwt", Sets: []ruleset.Set{v4, v6},
					Chains: []ruleset.Chain{{Name: "MWT", Rules: []ruleset.Rule{rule(v4), rule(v6)}}}})
				owned.Tables = []ruleset.TableID{where(v4)}
			} else {
				for _, s := range []ruleset.Set{v4, v6} {
					id := ruleset.TableID{Family: s.Family.Tables(), Name: "filter"}
					build.AddSet(where(s), s).AddChain(id, ruleset.Chain{Name: "MWT"}).AddRule(id, rule(s))
					owned.Chains = append(owned.Chains, ruleset.OwnedChains{Table: id, Chains: []string{"MWT"}})
					owned.IPSets = append(owned.IPSets, s)
				}
			}
			steps := []*ruleset.Tx{
				build,
				(&ruleset.Tx{}).AddElements(where(v4), v4, ruleset.Element{Addr: a, Comment: "uid-a"}, ruleset.Element{Addr: b, Comment: "uid-b"}).
					AddElements(where(v6), v6, ruleset.Element{Addr: six, Comment: "uid-a"}),
				(&ruleset.Tx{}).AddElements(where(v4), v4, ruleset.Element{Addr: a, Comment: "uid-a"}),
				(&ruleset.Tx{}).DestroyElements(where(v4), v4, ruleset.Element{Addr: b}, ruleset.Element{Addr: netip.MustParseAddr("198.18.60.9")}),
				(&ruleset.Tx{}).DestroyElements(where(v6), ruleset.Set{Name: "mwt-none", Family: ruleset.V6}, ruleset.Element{Addr: six}),
			}
			fake := New(be)
			err := netns.Enter(p, func() error {
				host := firewall.New(be)
				defer host.Close()
				for i, tx := range steps {
					if err := host.Apply(ctx, tx); err != nil {
						t.Fatalf("step %d on the kernel: %v", i, err)
					}
					if err := fake.Apply(ctx, tx); err != nil {
						t.Fatalf("step %d on the fake: %v", i, err)
					}
					for _, s := range []ruleset.Set{v4, v6} {
						got, err := host.ReadSet(ctx, where(s), s.Name)
						if err != nil {
							t.Fatal(err)
						}
						if want := fake.Set(where(s), s.Name); !sameSet(got, want, !native) {
							t.Fatalf("step %d, set %s: the kernel holds %+v, the fake %+v", i, s.Name, got, want)
						}
					}
				}
				if err := firewall.Remove(ctx, host, owned); err != nil {
					t.Fatalf("remove: %v", err)
				}
				for _, s := range []ruleset.Set{v4, v6} {
					if got, err := host.ReadSet(ctx, where(s), s.Name); err != nil || got != nil {
						t.Fatalf("set %s after Remove: %+v, %v", s.Name, got, err)
					}
				}
				return firewall.Remove(ctx, host, owned) // nothing there: no error
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// sameSet compares two sets' elements, in any order (with their comments
// when comments).
func sameSet(a, b *installed.Set, comments bool) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	key := func(s *installed.Set) []string {
		var out []string
		for _, e := range s.Elements {
			k := e.Addr.String()
			if comments {
				k += " " + e.Comment
			}
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(key(a), key(b))
}
