package ruleset

import (
	"fmt"
	"strings"
)

// Table is a native nftables table of meshwire's own with one base chain,
// written whole: one transaction puts it in place, replacing the table
// when it is there. ipMasq's table of an attachment and bridge's macspoof
// table are such tables. The firewall writes it over netlink (no tool);
// Script is the same table as an nft script (the golden files' text).
type Table struct {
	Family  Family
	Name    string
	Comment string
	Chain   BaseChain
	// Rules of the base chain, in order. In an inet table a rule's Family
	// (V4, V6) limits it to one address family, as its addresses do.
	Rules []Rule
}

// BaseChain is a chain hooked into netfilter with a policy of accept.
type BaseChain struct {
	Name     string
	Type     string // "filter", "nat"
	Hook     string // "prerouting", "postrouting", ...
	Priority int
}

// priority is how Script writes the chain's priority: nft's name for the
// standard nat priorities of the ip, ip6 and inet families, else the number.
func (t Table) priority() string {
	if t.Family == IP || t.Family == IP6 || t.Family == Inet {
		switch {
		case t.Chain.Type == "nat" && t.Chain.Priority == 100:
			return "srcnat"
		case t.Chain.Type == "nat" && t.Chain.Priority == -100:
			return "dstnat"
		}
	}
	return fmt.Sprint(t.Chain.Priority)
}

// Statement is the rule as Script writes it into the table: no counter,
// a single address without its prefix length.
func (r Rule) Statement() string {
	return r.nft(nftStyle{chainName: func(c string) string { return c }})
}

// Script renders t as an nft script that replaces the table: it is
// declared (so that the delete never fails), deleted and written anew.
func (t Table) Script() string {
	fam := t.Family.Name()
	var b strings.Builder
	fmt.Fprintf(&b, "add table %s %s\ndelete table %s %s\n", fam, t.Name, fam, t.Name)
	fmt.Fprintf(&b, "table %s %s {\n", fam, t.Name)
	if t.Comment != "" {
		fmt.Fprintf(&b, "\tcomment %q\n", t.Comment)
	}
	fmt.Fprintf(&b, "\tchain %s {\n\t\ttype %s hook %s priority %s; policy accept;\n", t.Chain.Name, t.Chain.Type, t.Chain.Hook, t.priority())
	for _, r := range t.Rules {
		fmt.Fprintf(&b, "\t\t%s\n", r.Statement())
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}
