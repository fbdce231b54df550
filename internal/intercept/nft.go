package intercept

import (
	"fmt"
	"strings"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// LegacyNftTable is the table (one per family, ip and ip6) where earlier
// meshwire versions kept their native nftables rules: removed when found.
const LegacyNftTable = "meshwire_intercept"

// baseChains describes how an iptables built-in chain is hooked in
// nftables, as istio-nftables hooks it.
var baseChains = map[string]string{
	Raw + "/PREROUTING":    "type filter hook prerouting priority -300;",
	Raw + "/OUTPUT":        "type filter hook output priority -300;",
	Mangle + "/PREROUTING": "type filter hook prerouting priority -150;",
	Mangle + "/OUTPUT":     "type route hook output priority -150;",
	NAT + "/PREROUTING":    "type nat hook prerouting priority -100;",
	NAT + "/OUTPUT":        "type nat hook output priority -100;",
}

// nftTableName is the inet table holding an iptables table's rules.
func nftTableName(table string) string {
	for _, nt := range NftTables {
		if nt.Table == table {
			return nt.Name
		}
	}
	return ""
}

// Nft renders the nftables rule set (BuildNft) as one script, one
// transaction: each of istio's tables is created if absent and deleted
// (istio-nftables flushes them: the same), then those with rules defined
// anew, each with a comment naming the rule set's fingerprint. An empty
// rule set only removes the tables (cleanup).
//
// One deliberate difference from istio-nftables: a TPROXY rule is
// followed by the same match with a drop. iptables' TPROXY target drops a
// packet that finds no proxy socket, nft's tproxy lets it go on to the
// application (so with istio-nftables, connections reach the application
// around the proxy while it is not listening); the drop keeps nftables as
// fail-closed as iptables (docs/reference-differences.md).
func Nft(rs *RuleSet) string {
	var b strings.Builder
	for _, nt := range NftTables {
		fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\n", nt.Name, nt.Name)
	}
	tag := TagFor(rs.Fingerprint())
	for _, nt := range NftTables {
		t := rs.Table(nt.Table)
		if t == nil {
			continue
		}
		fmt.Fprintf(&b, "table inet %s {\n\tcomment %q\n", nt.Name, tag)
		for _, c := range t.Chains {
			fmt.Fprintf(&b, "\tchain %s {\n", NftChain(c))
			if hook, ok := baseChains[t.Name+"/"+c]; ok {
				fmt.Fprintf(&b, "\t\t%s policy accept;\n", hook)
			}
			for _, r := range nftRules(t, c) {
				fmt.Fprintf(&b, "\t\t%s\n", r.NFT(NftChain))
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// nftRules are the rules Nft writes into chain c of t: the chain's rules,
// each TPROXY rule followed by its drop.
func nftRules(t *TableRules, c string) []ruleset.Rule {
	var out []ruleset.Rule
	for _, r := range t.Rules {
		if r.Chain != c {
			continue
		}
		out = append(out, r)
		if r.Target.Kind == ruleset.TProxy {
			d := r
			d.Target = ruleset.Target{Kind: ruleset.Drop}
			out = append(out, d)
		}
	}
	return out
}

// NftLegacyRemoval renders the removal of the tables of earlier meshwire
// versions, for the families given.
func NftLegacyRemoval(fams ...Family) string {
	var b strings.Builder
	for _, f := range fams {
		fam := f.Tables().Name()
		fmt.Fprintf(&b, "table %s %s\ndelete table %s %s\n", fam, LegacyNftTable, fam, LegacyNftTable)
	}
	return b.String()
}

// NftStatus compares istio's inet tables as read back through the firewall
// (by name; absent ones missing or nil) with the desired rule set: each
// table's comment names the fingerprint of the rule set written, and each
// chain must hold the rules Nft writes into it (so that a chain emptied
// behind meshwire's back is noticed).
func NftStatus(desired *RuleSet, have map[string]*firewall.Table) Status {
	present := 0
	for _, t := range have {
		if t != nil {
			present++
		}
	}
	if present == 0 {
		if desired.Empty() {
			return Current
		}
		return Absent
	}
	tag := TagFor(desired.Fingerprint())
	for _, nt := range NftTables {
		got, want := have[nt.Name], desired.Table(nt.Table)
		if (got == nil) != (want == nil) {
			return Different
		}
		if got == nil {
			continue
		}
		if got.Comment != tag || len(got.Chains) != len(want.Chains) {
			return Different
		}
		for _, c := range want.Chains {
			gc := got.Chain(NftChain(c))
			if gc == nil || len(gc.Rules) != len(nftRules(want, c)) {
				return Different
			}
		}
	}
	return Current
}
