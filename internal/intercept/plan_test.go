package intercept

import (
	"context"
	"slices"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// heldOf reads back what fw holds, as package apply does.
func heldOf(fw *fwfake.Fake, nft bool) *Held {
	h := &Held{IPTables: map[Family][]*installed.Table{}, Nft: map[string]*installed.Table{}}
	if nft {
		h.Nft = nftTables(fw)
		return h
	}
	for _, f := range bothFamilies {
		var tables []*installed.Table
		for _, n := range []string{Raw, Mangle, NAT} {
			if t := fw.Table(f.Tables(), n); t != nil {
				tables = append(tables, t)
			}
		}
		h.IPTables[f] = tables
	}
	return h
}

// applyOps writes what Plan asked for into fw.
func applyOps(t *testing.T, fw *fwfake.Fake, ops Ops) {
	t.Helper()
	for _, tx := range []*ruleset.Tx{ops.Restore[V4], ops.Restore[V6], ops.Nft} {
		if tx.Empty() {
			continue
		}
		if err := fw.Apply(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPlan: planned from nothing, applied, read back and planned again,
// the rules are current with nothing to do (unless forced); other
// settings are a difference that the next plan replaces; the policy
// routing of a mode no longer used is removed.
func TestPlan(t *testing.T) {
	tproxy := Default()
	tproxy.Mode = ModeTProxy
	for _, b := range []firewall.Backend{{Kind: firewall.IPTables, Variant: firewall.VariantNFT}, {Kind: firewall.NFTables}} {
		nft := b.Kind == firewall.NFTables
		t.Run(b.String(), func(t *testing.T) {
			fw := fwfake.New(b)
			want := Want{Config: Default(), IPv6: true, NFTables: nft}
			first := Plan(heldOf(fw, nft), nil, want)
			if first.Status[V4] != Absent || first.Status[V6] != Absent {
				t.Fatalf("nothing installed: %v", first.Status)
			}
			applyOps(t, fw, first)
			again := Plan(heldOf(fw, nft), nil, want)
			if again.Status[V4] != Current || again.Status[V6] != Current || !again.Restore[V4].Empty() || !again.Nft.Empty() {
				t.Fatalf("re-plan: %v", again.Status)
			}
			if len(again.Different) != 0 {
				t.Fatalf("different: %v", again.Different)
			}
			want.Force = true
			if forced := Plan(heldOf(fw, nft), nil, want); forced.Restore[V4].Empty() && forced.Nft.Empty() {
				t.Fatal("forced: nothing to write")
			}
			other := Plan(heldOf(fw, nft), nil, Want{Config: tproxy, IPv6: true, NFTables: nft})
			if !slices.Equal(other.Different, []Family{V4, V6}) {
				t.Fatalf("other settings: %v", other.Status)
			}
			applyOps(t, fw, other)
			if back := Plan(heldOf(fw, nft), nil, Want{Config: Default(), IPv6: false, NFTables: nft}); len(back.Remove) == 0 || slices.ContainsFunc(back.Add, func(s Step) bool { return s.Kind == StepRule }) {
				t.Fatalf("back to REDIRECT: add %v, remove %v", back.Add, back.Remove)
			}
			if got := heldOf(fw, nft).Marks(); !slices.Equal(got, []uint32{tproxy.TProxyMark}) {
				t.Fatalf("marks: %v", got)
			}
			for _, tx := range heldOf(fw, nft).Removal() {
				if err := fw.Apply(context.Background(), tx); err != nil {
					t.Fatal(err)
				}
			}
			if h := heldOf(fw, nft); len(h.Removal()) != 0 {
				t.Fatal("left after the removal")
			}
		})
	}
}
