package firewall

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
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
		{"iptables-restore", Backend{Kind: IPTables}.Restore(ctx, V4, "*nat\nCOMMIT\n"), "iptables"},
		{"ip6tables-legacy-save", func() error {
			_, err := (Backend{Kind: IPTables, Variant: VariantLegacy}).Save(ctx, V6, "nat")
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

// TestResolveWithoutToolsIsNotCached: a detection made with no tool is not
// remembered, and a remembered backend whose tools are gone is not used,
// so installing a tool afterwards takes effect.
func TestResolveWithoutToolsIsNotCached(t *testing.T) {
	withoutTools(t)
	ctx := context.Background()
	if _, err := Resolve(ctx, ""); err != nil {
		t.Fatal(err)
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
