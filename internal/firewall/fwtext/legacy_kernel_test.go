//go:build kernel

package fwtext_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// kernelNS runs fn in a throwaway network namespace (the caller holds the
// node-wide test lock: kerneltest.Require).
func kernelNS(t *testing.T, fn func(name string) error) {
	t.Helper()
	kerneltest.InNewNS(t, "fwlegacy", func(name, _ string) error { return fn(name) })
}

// TestLegacyChains: the getsockopt read sees the chains iptables-legacy
// made, of both families, and a namespace whose legacy nat table was never
// used reads as empty without loading it; Host.ChainNames and HasChain of
// legacy iptables answer the same with no tool at hand.
func TestLegacyChains(t *testing.T) {
	kerneltest.Require(t)
	kernelNS(t, func(name string) error {
		for _, f := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
			got, err := fwtext.LegacyChainNames(f, "nat")
			if err != nil || got != nil {
				return fmt.Errorf("IPv%d before any use: %v, %v", f, got, err)
			}
			if loaded, err := fwtext.LegacyTableLoaded(f.Tables(), "nat"); loaded || err != nil {
				return fmt.Errorf("IPv%d: reading instantiated nat (%v)", f, err)
			}
		}
		ipt := func(tool string, args ...string) error {
			out, err := exec.Command("ip", append([]string{"netns", "exec", name, tool, "-w", "5", "-t", "nat"}, args...)...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s %v: %v: %s", tool, args, err, out)
			}
			return nil
		}
		for _, c := range [][]string{
			{"iptables-legacy", "-N", "CNI-f0bca4ac77cde1bf2f3da5df"},
			{"iptables-legacy", "-A", "CNI-f0bca4ac77cde1bf2f3da5df", "-d", "198.18.0.0/24", "-m", "comment", "--comment", "name: \"x\" id: \"y\"", "-j", "ACCEPT"},
			{"iptables-legacy", "-A", "POSTROUTING", "-s", "198.18.0.5", "-j", "CNI-f0bca4ac77cde1bf2f3da5df"},
			{"iptables-legacy", "-N", "CNI-HOSTPORT-DNAT"},
			{"ip6tables-legacy", "-N", "CNI-DN-f0bca4ac77cde1bf2f3da"},
		} {
			if err := ipt(c[0], c[1:]...); err != nil {
				return err
			}
		}
		builtin := []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"}
		want := map[ruleset.IPVersion][]string{
			ruleset.V4: append(slices.Clone(builtin), "CNI-HOSTPORT-DNAT", "CNI-f0bca4ac77cde1bf2f3da5df"),
			ruleset.V6: append(slices.Clone(builtin), "CNI-DN-f0bca4ac77cde1bf2f3da"),
		}
		// No tool from here on.
		path := os.Getenv("PATH")
		defer os.Setenv("PATH", path)
		os.Setenv("PATH", "/nonexistent")
		ctx := context.Background()
		h := firewall.New(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantLegacy})
		defer h.Close()
		for _, f := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
			got, err := fwtext.LegacyChainNames(f, "nat")
			if err != nil || !slices.Equal(got, want[f]) {
				return fmt.Errorf("IPv%d chains %v, %v; want %v", f, got, err, want[f])
			}
			if got, err := h.ChainNames(ctx, f.Tables(), "nat"); err != nil || !slices.Equal(got, want[f]) {
				return fmt.Errorf("Host.ChainNames IPv%d: %v, %v", f, got, err)
			}
			for _, c := range want[f] {
				if ok, err := h.HasChain(ctx, f.Tables(), "nat", c); !ok || err != nil {
					return fmt.Errorf("HasChain IPv%d %s = %v, %v", f, c, ok, err)
				}
			}
			if ok, err := h.HasChain(ctx, f.Tables(), "nat", "CNI-ABSENT"); ok || err != nil {
				return fmt.Errorf("HasChain IPv%d of an absent chain = %v, %v", f, ok, err)
			}
			if got, err := h.ChainNames(ctx, f.Tables(), "mangle"); got != nil || err != nil {
				return fmt.Errorf("ChainNames IPv%d of an unloaded table = %v, %v", f, got, err)
			}
			if loaded, _ := fwtext.LegacyTableLoaded(f.Tables(), "mangle"); loaded {
				return fmt.Errorf("IPv%d: reading instantiated mangle", f)
			}
		}
		return nil
	})
}
