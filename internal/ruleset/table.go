package ruleset

// Table is a native nftables table with its chains and their rules, as a
// transaction writes it whole (Tx.AddTable, Tx.ReplaceTable): ipMasq's
// table of an attachment, bridge's macspoof table, istio's interception
// tables. A Table with no chains only declares the table (and its
// comment).
type Table struct {
	Family  Family
	Name    string
	Comment string
	// Sets of the table (native nftables), declared before its chains;
	// declaring one keeps its elements when it is there.
	Sets   []Set
	Chains []Chain
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

// IPTablesHook is how iptables-nft (and istio-nftables) hooks an
// iptables built-in chain of a table into nftables: raw's at priority
// -300, mangle's at -150 (its output chain of type route), nat's
// prerouting and output at -100 and postrouting at 100.
func IPTablesHook(table, chain string) (BaseChain, bool) {
	b, ok := iptablesHooks[table+"/"+chain]
	return b, ok
}

var iptablesHooks = map[string]BaseChain{
	"raw/PREROUTING":    {Type: "filter", Hook: "prerouting", Priority: -300},
	"raw/OUTPUT":        {Type: "filter", Hook: "output", Priority: -300},
	"mangle/PREROUTING": {Type: "filter", Hook: "prerouting", Priority: -150},
	"mangle/OUTPUT":     {Type: "route", Hook: "output", Priority: -150},
	"nat/PREROUTING":    {Type: "nat", Hook: "prerouting", Priority: -100},
	"nat/OUTPUT":        {Type: "nat", Hook: "output", Priority: -100},
	"nat/POSTROUTING":   {Type: "nat", Hook: "postrouting", Priority: 100},
}
