// Package installed holds what the host's firewall holds, as read back:
// Table, Chain and Rule, typed values whatever the backend (decoded from
// nf_tables over netlink, parsed from legacy iptables' text, or kept by
// the fake). What meshwire writes is the other layer, package ruleset
// (ruleset.Rule in a ruleset.Tx); a rule read back is named for its
// deletion by Ref.
package installed

import (
	"net/netip"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// An iptables table of family V4 is the nf_tables table of family IP
// with the same name (iptables-nft keeps it there; for iptables-legacy the
// family is only a name), so every table is named by a ruleset.Family and
// a name.

// Rule is one rule as read back: where it is, and what it matches and does,
// as typed values. The match fields' zero values mean "not matched on".
// Fields not listed here (a user's extra matches) do not break a read: their
// names are in Unknown and the typed fields describe the rest.
type Rule struct {
	Family   ruleset.Family // the table's family (IP or IP6 for iptables)
	Table    string
	Chain    string
	Handle   uint64 // nf_tables handle (0 when read from legacy iptables' text)
	Position int    // 1-based position in the chain (iptables' rule number)
	Comment  string // -m comment, or the nftables rule comment

	// IPFamily is the address family the rule is limited to in an inet (or
	// bridge) table (meta nfproto), or implied by its addresses; 0 is both.
	IPFamily ruleset.IPVersion
	Proto    string // "tcp", "udp", "sctp", "icmp", ... or a number
	Src, Dst netip.Prefix
	NotSrc   bool
	NotDst   bool
	SPort    uint16
	DPort    uint16
	NotDPort bool
	In, Out  string // interface names
	// Mark matches the packet mark: (mark & MarkMask) == Mark (or !=, with
	// NotMark). MarkMask is 0xffffffff for an exact match. HasMark tells a
	// match on mark 0 from no match.
	HasMark  bool
	Mark     uint32
	MarkMask uint32
	NotMark  bool
	// DstLocal: -m addrtype --dst-type LOCAL, fib daddr type local.
	DstLocal bool
	// NotDstMulticast: -m addrtype ! --dst-type MULTICAST.
	NotDstMulticast bool

	// Target is what the rule does, as iptables names it: ACCEPT, DROP,
	// RETURN, MASQUERADE, DNAT, SNAT, REDIRECT, TPROXY, MARK, CONNMARK, CT,
	// ... ("" for a jump, or no verdict at all).
	Target string
	// Jump is the user chain the rule jumps (or, with Goto, goes) to.
	Jump string
	Goto bool
	// ToDest is DNAT's --to-destination (nft: dnat to), port 0 when none.
	ToDest netip.AddrPort
	// ToPort is REDIRECT's --to-ports and TPROXY's --on-port.
	ToPort uint16
	// SetMark is MARK --set-xmark's or TPROXY --tproxy-mark's value (nft:
	// meta mark set).
	SetMark uint32

	// Spec is the rule after "-A CHAIN " as iptables-save prints it, for
	// rules read from text (legacy iptables, the Fake's iptables tables),
	// or the rule's statement for the Fake's nftables tables; "" when read
	// over netlink (see fwtext.InstalledIPTablesSpec).
	Spec string
	// Unknown names the matches and statements the typed fields do not
	// hold, separated by spaces ("" when they hold the whole rule). Rule
	// stays comparable with ==.
	Unknown string
}

// AddUnknown names one more match or statement the typed fields do not
// hold (for the decoders).
func (r *Rule) AddUnknown(what string) {
	if r.Unknown != "" {
		r.Unknown += " "
	}
	r.Unknown += what
}

// Chain is a chain as read back.
type Chain struct {
	Family  ruleset.Family
	Table   string
	Name    string
	Comment string // nftables chain comment
	// Hook is the netfilter hook of a base chain ("prerouting", ...);
	// "" for a regular chain. iptables' built-in chains have theirs.
	Hook  string
	Rules []Rule
}

// Table is a table as read back: its chains in order, with their rules.
type Table struct {
	Family  ruleset.Family
	Name    string
	Comment string // nftables table comment
	Chains  []*Chain
}

// Chain returns the named chain, or nil.
func (t *Table) Chain(name string) *Chain {
	if t == nil {
		return nil
	}
	for _, c := range t.Chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Rules returns every rule of the table, chain after chain.
func (t *Table) Rules() []Rule {
	var out []Rule
	if t != nil {
		for _, c := range t.Chains {
			out = append(out, c.Rules...)
		}
	}
	return out
}

// ID names the table.
func (t *Table) ID() ruleset.TableID { return ruleset.TableID{Family: t.Family, Name: t.Name} }

// Set is a set as read back: where it is (a native nftables table, or
// ruleset.IPSets for an ipset), its name, and its elements (an ipset's
// with their comments).
type Set struct {
	Table    ruleset.TableID
	Name     string
	Elements []ruleset.Element
}

// Has tells whether the set holds address a.
func (s *Set) Has(a netip.Addr) bool {
	if s == nil {
		return false
	}
	for _, e := range s.Elements {
		if e.Addr == a {
			return true
		}
	}
	return false
}
