package ambientnode

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// testNode is a Node whose firewall is fake, with the pods of enrolled
// already enrolled (their records carry the enrollment).
func testNode(t *testing.T, fw *fwfake.Fake, cfg ambient.Config, enrolled ...podstate.Record) *Node {
	t.Helper()
	dir := t.TempDir()
	store := podstate.New(nodelayout.At(dir))
	for _, r := range enrolled {
		if err := store.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	n, err := New(Options{Config: cfg, Backend: fw.Backend(), Store: store, ZtunnelSocket: filepath.Join(dir, "ztunnel.sock"),
		Firewall: func() firewall.Interface { return fw }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// TestProbeSets: the host rule and its probe sets, through the firewall's
// front door on each backend, without a kernel: installed with the
// addresses of the pods enrolled (an address left by a pod gone while no
// agent ran is dropped), again in place of itself, a pod's addresses
// added and removed (twice: no error), of the families the rules have;
// the rule and its sets stay while a pod is enrolled, and go whole once
// none is.
func TestProbeSets(t *testing.T) {
	ctx := context.Background()
	web := podstate.Record{ContainerID: "c1", IfName: "eth0", Namespace: "shop", Name: "web", UID: "uid-web",
		Ambient: &podstate.Enrollment{IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd50::5")}}}
	api := []netip.Addr{netip.MustParseAddr("10.0.0.6")}
	stale := netip.MustParseAddr("10.0.0.99")
	for _, b := range []firewall.Backend{
		{Kind: firewall.IPTables, Variant: firewall.VariantLegacy},
		{Kind: firewall.IPTables, Variant: firewall.VariantNFT},
		{Kind: firewall.NFTables},
	} {
		t.Run(b.String(), func(t *testing.T) {
			for _, ipv6 := range []bool{false, true} {
				cfg := ambient.Config{IPv6: ipv6}
				fw := fwfake.New(b)
				n := testNode(t, fw, cfg, web)
				native := b.Kind == firewall.NFTables
				where := func(f ruleset.IPVersion) ruleset.TableID {
					if native {
						return ruleset.TableID{Family: ruleset.Inet, Name: ambient.NftTablePrefix + "nat"}
					}
					return ruleset.IPSets(f)
				}
				// has lists the addresses of the probe set of family f.
				has := func(f ruleset.IPVersion) string {
					s := fw.Set(where(f), ambient.ProbeSetName(f))
					if s == nil {
						return "no set"
					}
					var out []string
					for _, e := range s.Elements {
						out = append(out, e.Addr.String())
						if !native && e.Comment == "" {
							t.Errorf("ipset element %s without its pod's uid", e.Addr)
						}
					}
					return strings.Join(out, " ")
				}
				// An address of an earlier agent's pod, gone since.
				_, earlier := ambient.Host(cfg, native, []ruleset.Element{{Addr: stale, Comment: "gone"}})
				if err := fw.Apply(ctx, earlier); err != nil {
					t.Fatal(err)
				}
				for round := range 2 {
					if err := n.InstallHost(ctx); err != nil {
						t.Fatalf("install %d: %v\n%s", round, err, fw.Dump())
					}
					if got := has(ruleset.V4); got != "10.0.0.5" {
						t.Fatalf("install %d: probe set v4 %q, want the enrolled pod's only\n%s", round, got, fw.Dump())
					}
				}
				if got, want := has(ruleset.V6), map[bool]string{false: "no set", true: "fd50::5"}[ipv6]; got != want {
					t.Fatalf("probe set v6 %q, want %q", got, want)
				}
				for range 2 {
					if err := n.probeAddrs(ctx, "uid-api", api, true); err != nil {
						t.Fatal(err)
					}
				}
				if got := has(ruleset.V4); got != "10.0.0.5 10.0.0.6" {
					t.Fatalf("after an add: %q", got)
				}
				for range 2 {
					if err := n.probeAddrs(ctx, "uid-web", web.Ambient.IPs, false); err != nil {
						t.Fatal(err)
					}
				}
				if got := has(ruleset.V4); got != "10.0.0.6" {
					t.Fatalf("after a removal: %q", got)
				}
				if removed, err := n.RemoveHost(ctx); err != nil || removed {
					t.Fatalf("with a pod enrolled, the host rule went: %v %v", removed, err)
				}
				n.setPod(web.File(), web, false)
				if removed, err := n.RemoveHost(ctx); err != nil || !removed {
					t.Fatalf("with no pod enrolled: %v %v\n%s", removed, err, fw.Dump())
				}
				if dump := fw.Dump(); strings.Contains(dump, ambient.ChainPostrouting) || strings.Contains(dump, ambient.ProbeSet) || strings.Contains(dump, ambient.NftTablePrefix) {
					t.Fatalf("left after RemoveHost:\n%s", dump)
				}
			}
		})
	}
}
