package apply

import (
	"context"
	"slices"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// heldOf reads back what fw holds, as Prepare does.
func heldOf(t *testing.T, fw *fwfake.Fake, b firewall.Backend) *Held {
	t.Helper()
	h := read(context.Background(), b, fw)
	for f, err := range h.errs {
		t.Fatalf("read %s: %v", f, err)
	}
	return &h.Held
}

// applyOps writes what Operations asked for into fw.
func applyOps(t *testing.T, fw *fwfake.Fake, ops Ops) {
	t.Helper()
	for _, tx := range []*ruleset.Tx{ops.Restore[intercept.V4], ops.Restore[intercept.V6], ops.Nft} {
		if tx.Empty() {
			continue
		}
		if err := fw.Apply(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOperations: planned from nothing, applied, read back and planned
// again, the rules are current with nothing to do (unless forced); other
// settings are a difference that the next plan replaces; the policy
// routing of a mode no longer used is removed.
func TestOperations(t *testing.T) {
	tproxy := intercept.Default()
	tproxy.Mode = intercept.ModeTProxy
	v4, v6 := intercept.V4, intercept.V6
	for _, b := range []firewall.Backend{{Kind: firewall.IPTables, Variant: firewall.VariantNFT}, {Kind: firewall.NFTables}} {
		nft := b.Kind == firewall.NFTables
		t.Run(b.String(), func(t *testing.T) {
			fw := fwfake.New(b)
			want := Want{Config: intercept.Default(), IPv6: true, NFTables: nft}
			first := Operations(heldOf(t, fw, b), nil, want)
			if first.Status[v4] != intercept.Absent || first.Status[v6] != intercept.Absent {
				t.Fatalf("nothing installed: %v", first.Status)
			}
			applyOps(t, fw, first)
			again := Operations(heldOf(t, fw, b), nil, want)
			if again.Status[v4] != intercept.Current || again.Status[v6] != intercept.Current || !again.Restore[v4].Empty() || !again.Nft.Empty() {
				t.Fatalf("re-plan: %v", again.Status)
			}
			if len(again.Different) != 0 {
				t.Fatalf("different: %v", again.Different)
			}
			want.Force = true
			if forced := Operations(heldOf(t, fw, b), nil, want); forced.Restore[v4].Empty() && forced.Nft.Empty() {
				t.Fatal("forced: nothing to write")
			}
			other := Operations(heldOf(t, fw, b), nil, Want{Config: tproxy, IPv6: true, NFTables: nft})
			if !slices.Equal(other.Different, []intercept.Family{v4, v6}) {
				t.Fatalf("other settings: %v", other.Status)
			}
			applyOps(t, fw, other)
			if back := Operations(heldOf(t, fw, b), nil, Want{Config: intercept.Default(), IPv6: false, NFTables: nft}); len(back.Remove) == 0 || slices.ContainsFunc(back.Add, func(s intercept.Step) bool { return s.Kind == intercept.StepRule }) {
				t.Fatalf("back to REDIRECT: add %v, remove %v", back.Add, back.Remove)
			}
			if got := heldOf(t, fw, b).Marks(); !slices.Equal(got, []uint32{tproxy.TProxyMark}) {
				t.Fatalf("marks: %v", got)
			}
			for _, tx := range heldOf(t, fw, b).Removal() {
				if err := fw.Apply(context.Background(), tx); err != nil {
					t.Fatal(err)
				}
			}
			if h := heldOf(t, fw, b); len(h.Removal()) != 0 {
				t.Fatal("left after the removal")
			}
		})
	}
}
