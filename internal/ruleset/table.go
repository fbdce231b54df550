package ruleset

import (
	"fmt"
	"strings"
)

// Table is a native nftables table with its chains and their rules, as a
// transaction writes it whole (Tx.AddTable, Tx.ReplaceTable): ipMasq's
// table of an attachment, bridge's macspoof table, istio's interception
// tables. A Table with no chains only declares the table (and its
// comment).
type Table struct {
	Family  Family
	Name    string
	Comment string
	Chains  []Chain
}

// ID names the table.
func (t Table) ID() TableID { return TableID{Family: t.Family, Name: t.Name} }

// Chain is a chain: a regular one, or a base chain hooked into netfilter
// (Base). Rules are written with it when it is part of a Table; a chain
// added on its own comes empty.
type Chain struct {
	Name    string
	Comment string
	Base    *BaseChain
	// Rules of the chain, in order. In an inet table a rule's Family
	// (V4, V6) limits it to one address family, as its addresses do.
	Rules []Rule
}

// BaseChain is how a chain is hooked into netfilter, with a policy of
// accept.
type BaseChain struct {
	Type     string // "filter", "nat", "route"
	Hook     string // "prerouting", "postrouting", ...
	Priority int
	// PriorityName is how nft scripts write Priority ("srcnat",
	// "dstnat"); "" writes the number.
	PriorityName string
}

// Spec is the chain's declaration inside braces, as nft writes it:
// "type nat hook postrouting priority srcnat; policy accept;".
func (b BaseChain) Spec() string {
	p := b.PriorityName
	if p == "" {
		p = fmt.Sprint(b.Priority)
	}
	return fmt.Sprintf("type %s hook %s priority %s; policy accept;", b.Type, b.Hook, p)
}

// Block renders t as an nft table block ("table F N { ... }"): its
// comment, then each chain with its hook, comment and rules.
func (t Table) Block() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", t.Family, t.Name)
	if t.Comment != "" {
		fmt.Fprintf(&b, "\tcomment %q\n", t.Comment)
	}
	for _, c := range t.Chains {
		fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
		if c.Base != nil {
			fmt.Fprintf(&b, "\t\t%s\n", c.Base.Spec())
		}
		if c.Comment != "" {
			fmt.Fprintf(&b, "\t\tcomment %q\n", c.Comment)
		}
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\t\t%s\n", r.Statement())
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// Script renders t as an nft script that replaces the table: it is
// declared (so that the delete never fails), deleted and written anew.
// It is what Tx.ReplaceTable means, as text (the golden files', and what
// the kernel tests compare the netlink encoding with).
func (t Table) Script() string {
	return fmt.Sprintf("add table %s %s\ndelete table %s %s\n", t.Family, t.Name, t.Family, t.Name) + t.Block()
}
