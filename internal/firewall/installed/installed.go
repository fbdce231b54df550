// Package installed holds what the host's firewall holds, as read back:
// Table, Chain and Rule, typed values whatever the backend (decoded from
// nf_tables over netlink, parsed from legacy iptables' text, or kept by
// the fake). What meshwire writes is the other layer, package ruleset
// (ruleset.Rule in a ruleset.Tx); a rule read back is named for its
// deletion by Ref.
package installed

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

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
	// over netlink (see IPTablesSpec).
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

// IPTablesSpec renders the rule after "-A CHAIN " as iptables-save prints
// it, for use in `-D CHAIN spec` lines: Spec when the rule was read from
// text, else from the typed fields when they hold the whole rule (ok is
// false when Unknown is not empty, or the rule is not an iptables one).
func (r Rule) IPTablesSpec() (spec string, ok bool) {
	if r.Spec != "" && (r.Family == ruleset.IP || r.Family == ruleset.IP6) {
		return r.Spec, true
	}
	if r.Unknown != "" || (r.Family != ruleset.IP && r.Family != ruleset.IP6) {
		return "", false
	}
	if r.ToPort != 0 || r.SetMark != 0 || (r.ToDest.IsValid() && r.Target != "DNAT") || (r.Jump != "" && r.Target != "") {
		return "", false // options of a target rendered below only by name
	}
	var a []string
	neg := func(n bool) {
		if n {
			a = append(a, "!")
		}
	}
	if r.Src.IsValid() {
		neg(r.NotSrc)
		a = append(a, "-s", r.Src.String())
	}
	if r.Dst.IsValid() {
		neg(r.NotDst)
		a = append(a, "-d", r.Dst.String())
	}
	if r.In != "" {
		a = append(a, "-i", ruleset.QuoteArg(r.In))
	}
	if r.Out != "" {
		a = append(a, "-o", ruleset.QuoteArg(r.Out))
	}
	if r.Proto != "" {
		a = append(a, "-p", ruleset.QuoteArg(r.Proto))
	}
	if r.SPort != 0 || r.DPort != 0 {
		if r.Proto != "tcp" && r.Proto != "udp" && r.Proto != "sctp" {
			return "", false // a port match needs the protocol's module
		}
		a = append(a, "-m", r.Proto)
		if r.SPort != 0 {
			a = append(a, "--sport", strconv.Itoa(int(r.SPort)))
		}
		if r.DPort != 0 {
			neg(r.NotDPort)
			a = append(a, "--dport", strconv.Itoa(int(r.DPort)))
		}
	}
	if r.DstLocal {
		a = append(a, "-m", "addrtype", "--dst-type", "LOCAL")
	}
	if r.NotDstMulticast {
		a = append(a, "-m", "addrtype", "!", "--dst-type", "MULTICAST")
	}
	if r.HasMark {
		a = append(a, "-m", "mark")
		neg(r.NotMark)
		if r.MarkMask == 0xffffffff {
			a = append(a, "--mark", fmt.Sprintf("%#x", r.Mark))
		} else {
			a = append(a, "--mark", fmt.Sprintf("%#x/%#x", r.Mark, r.MarkMask))
		}
	}
	if r.Comment != "" {
		a = append(a, "-m", "comment", "--comment", ruleset.QuoteArg(r.Comment))
	}
	switch {
	case r.Jump != "" && r.Goto:
		a = append(a, "-g", ruleset.QuoteArg(r.Jump))
	case r.Jump != "":
		a = append(a, "-j", ruleset.QuoteArg(r.Jump))
	case r.Target == "DNAT" && r.ToDest.Addr().IsValid():
		a = append(a, "-j", "DNAT", "--to-destination", addrPortText(r.ToDest))
	case r.Target == "MASQUERADE" || r.Target == "ACCEPT" || r.Target == "DROP" || r.Target == "RETURN":
		a = append(a, "-j", r.Target)
	case r.Target != "":
		return "", false // a target whose options the typed fields do not hold
	}
	return strings.Join(a, " "), true
}

func addrPortText(ap netip.AddrPort) string {
	if ap.Port() == 0 {
		return ap.Addr().String()
	}
	return ap.String()
}

// Ref names the rule for its deletion (ruleset.Tx.DeleteRef): by handle
// when it was read from nf_tables, else by its iptables form (Spec, or
// one rendered from the typed fields when they hold the whole rule), else
// by position.
func (r Rule) Ref() ruleset.RuleRef {
	ref := ruleset.RuleRef{Chain: r.Chain, Handle: r.Handle, Position: r.Position}
	if spec, ok := r.IPTablesSpec(); ok {
		ref.Spec = spec
	}
	return ref
}

// ID names the table.
func (t *Table) ID() ruleset.TableID { return ruleset.TableID{Family: t.Family, Name: t.Name} }
