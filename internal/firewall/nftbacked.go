package firewall

import (
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// NFTablesBacked reports whether b's iptables rules live in nf_tables (the
// iptables-nft variant, or a default `iptables` that is iptables-nft), so
// that they are read, appended and removed over netlink (internal/nftnl).
func (b Backend) NFTablesBacked() bool {
	switch {
	case b.Kind != IPTables:
		return false
	case b.Variant == VariantNFT:
		return true
	case b.Variant == VariantLegacy:
		return false
	}
	return defaultIsNFT()
}

// defaultIsNFT: both families' default tools are iptables-nft. Debian
// switches iptables and ip6tables as separate alternatives; when only one of
// them is the nft variant, the tools are used for both (rules written over
// netlink for one family would be invisible to the other's tools).
var defaultIsNFT = sync.OnceValue(func() bool {
	return isNFTTool(resolveTool("iptables-restore")) && isNFTTool(resolveTool("ip6tables-restore"))
})

// resolveTool follows a tool's symlinks (Debian's alternatives) to the
// binary that implements it; "" when it is not installed.
func resolveTool(name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		return ""
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	return filepath.Base(p)
}

// isNFTTool tells an iptables-nft binary (xtables-nft-multi,
// iptables-nft-restore) from a legacy one (xtables-legacy-multi, the
// single-binary iptables-restore of iptables < 1.8).
func isNFTTool(base string) bool { return strings.Contains(base, "nft") }
