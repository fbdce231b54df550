package intercept

import (
	"fmt"
	"regexp"
	"strings"
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
			var chains []string
			for _, c := range []string{"PREROUTING", "OUTPUT"} {
				for _, r := range t.Rules {
					if r.Chain == c {
						chains = append(chains, c)
						break
					}
				}
			}
			chains = append(chains, t.Chains...)
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

var nftCommentRE = regexp.MustCompile(`comment "(` + regexp.QuoteMeta(Tag) + `:[0-9a-f]+)"`)

// NftStatus compares `nft list table <family> meshwire_intercept` output
// (empty when the table does not exist) with the desired rule set.
func NftStatus(desired *RuleSet, listing string) Status {
	if strings.TrimSpace(listing) == "" {
		if desired.Empty() {
			return Current
		}
		return Absent
	}
	m := nftCommentRE.FindStringSubmatch(listing)
	if m != nil && !desired.Empty() && m[1] == TagFor(desired.Fingerprint()) && nftRuleCount(listing) == nftRuleCount(Nft(desired)) {
		return Current
	}
	return Different
}

// nftRuleCount counts the rules in the chains of a listing or script.
func nftRuleCount(text string) int {
	n, depth := 0, 0
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		switch {
		case strings.HasSuffix(l, "{"):
			depth++
		case l == "}":
			depth--
		case depth == 2 && l != "" && !strings.HasPrefix(l, "type ") && !strings.HasPrefix(l, "comment "):
			n++
		}
	}
	return n
}
