package ruleset

// Owned names what a feature owns in a namespace's firewall, by which its
// rules are replaced and removed whole through the firewall
// (firewall.Replace, firewall.Remove), whatever the backend: its native
// nftables tables, or its chains in iptables tables with the jumps to
// them from built-in chains, and its sets.
type Owned struct {
	// Tables are native nftables tables, each the feature's whole (its
	// sets with it).
	Tables []TableID
	// Chains are chains in iptables tables.
	Chains []OwnedChains
	// IPSets are the ipsets of the iptables backends' rules, removed once
	// no rule uses them.
	IPSets []Set
}

// OwnedChains are a feature's chains in one iptables table, and the
// built-in chains that jump to them.
type OwnedChains struct {
	Table    TableID
	Builtins []string
	Chains   []string
}
