package fwtext

import (
	"fmt"
	"strings"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// Sets as the tools read them: a native nftables table's sets in an nft
// script (nftSetCommand), the iptables backends' ipsets as `ipset
// restore` reads them (IPSetRestore).

// nftSetCommand renders a set or element operation as nft commands:
// "add set F T S { type ipv4_addr; }", "flush set ...", Destroy as the
// set's declaration and deletion (no error when it is not there, on
// every nft version), "add element F T S { a, b }", "delete element ...".
// An element deletion fails when one is not there: the firewall removes
// from the operation those it does not hold before it renders it.
func nftSetCommand(o ruleset.Op) (string, error) {
	set := o.Table.String() + " " + o.Set.Name
	decl := fmt.Sprintf("add set %s { type %s; }\n", set, o.Set.NftType())
	switch o.Object() + " " + o.Verb.String() {
	case "set add":
		return decl, nil
	case "set flush":
		return "flush set " + set + "\n", nil
	case "set destroy":
		return decl + "delete set " + set + "\n", nil
	case "element add":
		return "add element " + set + " " + nftElements(o.Elements) + "\n", nil
	case "element destroy":
		return "delete element " + set + " " + nftElements(o.Elements) + "\n", nil
	}
	return "", fmt.Errorf("%s: not an nft set operation", o)
}

func nftElements(elems []ruleset.Element) string {
	s := make([]string, len(elems))
	for i, e := range elems {
		s[i] = e.Addr.String()
	}
	return "{ " + strings.Join(s, ", ") + " }"
}

// IPSetRestore renders tx's ipset operations as `ipset restore` reads
// them, one command a line: "create S hash:ip family inet comment
// -exist", "flush S", "destroy S", "add S A comment \"C\" -exist", "del
// S A -exist". The firewall writes them over netlink with the same
// meaning (a destroy of a set that is not there is no error there);
// this is their text, for golden files and logs. An operation of
// another kind is an error.
func IPSetRestore(tx *ruleset.Tx) (string, error) {
	var b strings.Builder
	for _, o := range tx.Ops() {
		if !o.IPSet() {
			return "", fmt.Errorf("%s: not an ipset operation", o)
		}
		name := o.Set.Name
		switch o.Object() + " " + o.Verb.String() {
		case "set add":
			fmt.Fprintf(&b, "create %s hash:ip family %s comment -exist\n", name, ipsetFamily(o.Set.Family))
		case "set flush":
			fmt.Fprintf(&b, "flush %s\n", name)
		case "set destroy":
			fmt.Fprintf(&b, "destroy %s\n", name)
		case "element add":
			for _, e := range o.Elements {
				fmt.Fprintf(&b, "add %s %s", name, e.Addr)
				if e.Comment != "" {
					fmt.Fprintf(&b, " comment %q", e.Comment)
				}
				b.WriteString(" -exist\n")
			}
		case "element destroy":
			for _, e := range o.Elements {
				fmt.Fprintf(&b, "del %s %s -exist\n", name, e.Addr)
			}
		default:
			return "", fmt.Errorf("%s: not an ipset operation", o)
		}
	}
	return b.String(), nil
}

func ipsetFamily(f ruleset.IPVersion) string {
	if f == ruleset.V6 {
		return "inet6"
	}
	return "inet"
}

// SplitIPSets cuts tx into runs, in order, of ipset operations and of the
// others: each run is applied whole by its own means (netlink for
// ipsets, the iptables transaction for the rest), one after the other.
func SplitIPSets(tx *ruleset.Tx) []*ruleset.Tx {
	var out []*ruleset.Tx
	for i, o := range tx.Ops() {
		if i == 0 || o.IPSet() != tx.Ops()[i-1].IPSet() {
			out = append(out, &ruleset.Tx{})
		}
		out[len(out)-1].AppendOps(o)
	}
	return out
}

// IsIPSets tells whether every operation of tx is an ipset's.
func IsIPSets(tx *ruleset.Tx) bool {
	for _, o := range tx.Ops() {
		if !o.IPSet() {
			return false
		}
	}
	return !tx.Empty()
}
