package firewall

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// withoutTools runs the test with no firewall tool on PATH and the node's
// detection cache in a temporary directory.
func withoutTools(t *testing.T) {
	t.Helper()
	t.Setenv("PATH", t.TempDir())
	dir := t.TempDir()
	oldCache, oldOld := CacheFile, OldCacheFiles
	CacheFile, OldCacheFiles = filepath.Join(dir, "firewall-backend"), []string{filepath.Join(dir, "old")}
	t.Cleanup(func() { CacheFile, OldCacheFiles = oldCache, oldOld })
}

// TestMissingToolNamesThePackage: a tool that is not installed fails with
// code 50 and the package to install, for every tool the backends run.
func TestMissingToolNamesThePackage(t *testing.T) {
	withoutTools(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		err  error
		pkg  string
	}{
		{"iptables-restore", Backend{Kind: IPTables}.Restore(ctx, ruleset.V4, "*nat\nCOMMIT\n"), "iptables"},
		{"ip6tables-legacy-save", func() error {
			_, err := (Backend{Kind: IPTables, Variant: VariantLegacy}).Save(ctx, ruleset.V6, "nat")
			return err
		}(), "iptables"},
		{"nft", NftApply(ctx, "list tables"), "nftables"},
		{"nft", Backend{Kind: NFTables}.Available(ctx), "nftables"},
	} {
		if cnierr.Code(tc.err) != cnierr.CodeNotAvailable {
			t.Errorf("%s: code %d, want %d (%v)", tc.name, cnierr.Code(tc.err), cnierr.CodeNotAvailable, tc.err)
		}
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.name+" is not installed") || !strings.Contains(tc.err.Error(), "apt-get install "+tc.pkg) {
			t.Errorf("%s: the error does not name the tool and its package: %v", tc.name, tc.err)
		}
	}
}

// TestResolveWithoutToolsIsNotCached: on a node with no firewall tool and
// no nf_tables over netlink, the detection (iptables, unusable) is not
// remembered, and a remembered backend whose tools are gone is not used,
// so installing a tool afterwards takes effect.
func TestResolveWithoutToolsIsNotCached(t *testing.T) {
	withoutTools(t)
	reachable(t, false)
	ctx := context.Background()
	if b, err := Resolve(ctx, ""); err != nil || b.Kind != IPTables {
		t.Fatalf("Resolve = %s, %v; want iptables", b, err)
	}
	if _, err := os.Stat(CacheFile); !os.IsNotExist(err) {
		t.Fatalf("a detection with no tool was cached (%v)", err)
	}

	// A cache an earlier version wrote with no tool installed: "iptables".
	Remember(Backend{Kind: IPTables})
	nft := filepath.Join(os.Getenv("PATH"), "nft")
	if err := os.WriteFile(nft, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := Resolve(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if b.Kind != NFTables {
		t.Errorf("with only nft installed, Resolve = %s, want nftables", b)
	}
	if c, ok := Cached(); !ok || c.Kind != NFTables {
		t.Errorf("cache holds %v (%v), want nftables", c, ok)
	}
}

// TestResolveWithoutToolsOverNetlink: with no firewall tool but nf_tables
// answering over netlink, the node's backend is native nftables (ipMasq
// needs no tool there), remembered so that DEL uses what ADD used; a tool
// installed later does not change it until the cache goes (reboot).
func TestResolveWithoutToolsOverNetlink(t *testing.T) {
	withoutTools(t)
	reachable(t, true)
	ctx := context.Background()
	if b, err := Resolve(ctx, ""); err != nil || b.Kind != NFTables {
		t.Fatalf("Resolve = %s, %v; want nftables", b, err)
	}
	if c, ok := Cached(); !ok || c.Kind != NFTables {
		t.Fatalf("cache holds %v (%v), want nftables", c, ok)
	}
	if err := os.WriteFile(filepath.Join(os.Getenv("PATH"), "iptables-restore"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := Resolve(ctx, ""); err != nil || b.Kind != NFTables {
		t.Errorf("after installing iptables, Resolve = %s, %v; want the cached nftables", b, err)
	}
}

// reachable makes Detect see nf_tables over netlink, or not.
func reachable(t *testing.T, yes bool) {
	old := nftablesReachable
	nftablesReachable = func() bool { return yes }
	t.Cleanup(func() { nftablesReachable = old })
}
