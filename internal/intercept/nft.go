package intercept

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshwire/meshwire/internal/firewall"
)

// NftTable is the name of meshwire's native nftables table, one per family
// (ip and ip6).
const NftTable = "meshwire_intercept"

// NftFamily is the nftables family keyword of an address family.
func NftFamily(f Family) string {
	if f == V6 {
		return "ip6"
	}
	return "ip"
}

// baseChain describes how an iptables built-in chain is hooked in nftables.
var baseChains = map[string]string{
	Raw + "/PREROUTING":    "type filter hook prerouting priority -300;",
	Raw + "/OUTPUT":        "type filter hook output priority -300;",
	Mangle + "/PREROUTING": "type filter hook prerouting priority -150;",
	Mangle + "/OUTPUT":     "type route hook output priority -150;",
	NAT + "/PREROUTING":    "type nat hook prerouting priority -100;",
	NAT + "/OUTPUT":        "type nat hook output priority -100;",
}

func nftChain(table, chain string) string { return table + "_" + chain }

// Nft renders the rule sets as one nftables script: for each family, the
// table is created if absent, deleted, and defined anew, all in the single
// transaction `nft -f` makes of a script. A nil or empty rule set only
// removes its table (cleanup).
func Nft(sets ...*RuleSet) string {
	var b strings.Builder
	for _, rs := range sets {
		fam := NftFamily(rs.Family)
		fmt.Fprintf(&b, "table %s %s\ndelete table %s %s\n", fam, NftTable, fam, NftTable)
		if rs.Empty() {
			continue
		}
		fmt.Fprintf(&b, "table %s %s {\n\tcomment %q\n", fam, NftTable, TagFor(rs.Fingerprint()))
		for _, t := range rs.Tables {
			chains := nftChains(t)
			for _, c := range chains {
				fmt.Fprintf(&b, "\tchain %s {\n", nftChain(t.Name, c))
				if hook, ok := baseChains[t.Name+"/"+c]; ok {
					fmt.Fprintf(&b, "\t\t%s policy accept;\n", hook)
				}
				for _, r := range t.Rules {
					if r.Chain != c {
						continue
					}
					name := func(ch string) string { return nftChain(t.Name, ch) }
					fmt.Fprintf(&b, "\t\t%s\n", r.NFT(rs.Family, name))
					if r.Target.Kind == TProxy {
						// iptables' TPROXY drops a packet that finds no
						// proxy socket; nft's tproxy lets it go on.
						d := r
						d.Target = Target{Kind: Drop}
						fmt.Fprintf(&b, "\t\t%s\n", d.NFT(rs.Family, name))
					}
				}
				b.WriteString("\t}\n")
			}
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// nftChains lists the chains Nft writes for a table: the built-in ones
// that get rules, then meshwire's own.
func nftChains(t *TableRules) []string {
	var chains []string
	for _, c := range []string{"PREROUTING", "OUTPUT"} {
		if slices.ContainsFunc(t.Rules, func(r Rule) bool { return r.Chain == c }) {
			chains = append(chains, c)
		}
	}
	return append(chains, t.Chains...)
}

// NftStatus compares meshwire's nftables table of the rule set's family, as
// read back through the firewall (nil when it is not there), with the
// desired rule set: the table's comment names the fingerprint of the rule
// set written, and each chain must hold the rules Nft writes into it (so
// that a chain emptied behind meshwire's back is noticed).
func NftStatus(desired *RuleSet, t *firewall.Table) Status {
	if t == nil {
		if desired.Empty() {
			return Current
		}
		return Absent
	}
	if desired.Empty() || t.Comment != TagFor(desired.Fingerprint()) {
		return Different
	}
	want := map[string]int{}
	for _, tr := range desired.Tables {
		for _, c := range nftChains(tr) {
			want[nftChain(tr.Name, c)] = 0
		}
		for _, r := range tr.Rules {
			n := 1
			if r.Target.Kind == TProxy {
				n = 2 // and its drop
			}
			want[nftChain(tr.Name, r.Chain)] += n
		}
	}
	if len(t.Chains) != len(want) {
		return Different
	}
	for _, c := range t.Chains {
		if n, ok := want[c.Name]; !ok || n != len(c.Rules) {
			return Different
		}
	}
	return Current
}
