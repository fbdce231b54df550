package fwtext

import (
	"fmt"
	"strings"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// IPTablesFamily is the address family of an iptables transaction: that
// of its tables, which must all be iptables tables of one family (IP or
// IP6).
func IPTablesFamily(tx *ruleset.Tx) (ruleset.IPVersion, error) {
	var v ruleset.IPVersion
	for _, o := range tx.Ops() {
		w := ruleset.V4
		switch o.Table.Family {
		case ruleset.IP:
		case ruleset.IP6:
			w = ruleset.V6
		default:
			return 0, fmt.Errorf("%s: not an iptables table", o)
		}
		if v != 0 && v != w {
			return 0, fmt.Errorf("%s: an iptables transaction is of one address family (one iptables-restore)", o)
		}
		v = w
	}
	return v, nil
}

// IPTablesRestore renders tx as one iptables-restore --noflush payload:
// each run of operations on one table is a "*table ... COMMIT" block.
// Chains are declared (Add: ":C - [0:0]", which also empties one that is
// there), created (-N), flushed (-F) and deleted (-X); rules appended
// (-A), inserted (-I) and deleted (-D: by their iptables form, a rule
// read back by its Spec or else its position). Tables are neither added
// nor deleted in iptables.
func IPTablesRestore(tx *ruleset.Tx) (string, error) {
	if _, err := IPTablesFamily(tx); err != nil {
		return "", err
	}
	var b strings.Builder
	table := ""
	for _, o := range tx.Ops() {
		line, err := iptablesLine(o)
		if err != nil {
			return "", err
		}
		if o.Table.Name != table {
			if table != "" {
				b.WriteString("COMMIT\n")
			}
			table = o.Table.Name
			fmt.Fprintf(&b, "*%s\n", table)
		}
		b.WriteString(line + "\n")
	}
	if table != "" {
		b.WriteString("COMMIT\n")
	}
	return b.String(), nil
}

func iptablesLine(o ruleset.Op) (string, error) {
	switch o.Object() {
	case "chain":
		c := o.Chain.Name
		switch o.Verb {
		case ruleset.Add:
			return ":" + c + " - [0:0]", nil
		case ruleset.Create:
			return "-N " + c, nil
		case ruleset.Flush:
			return "-F " + c, nil
		case ruleset.Delete:
			return "-X " + c, nil
		}
	case "rule":
		c := o.ChainName()
		switch {
		case o.Verb == ruleset.Add:
			return "-A " + c + " " + o.Rule.IPTablesSpec(), nil
		case o.Verb == ruleset.Insert:
			return fmt.Sprintf("-I %s %d %s", c, o.Index+1, o.Rule.IPTablesSpec()), nil
		case o.Verb == ruleset.Delete && o.Rule != nil:
			return "-D " + c + " " + o.Rule.IPTablesSpec(), nil
		case o.Verb == ruleset.Delete && o.Ref.Spec != "":
			return "-D " + c + " " + o.Ref.Spec, nil
		case o.Verb == ruleset.Delete && o.Ref.Position > 0:
			return fmt.Sprintf("-D %s %d", c, o.Ref.Position), nil
		case o.Verb == ruleset.Delete:
			return "", fmt.Errorf("%s: a rule read back with neither its iptables form nor its position", o)
		}
	}
	return "", fmt.Errorf("%s: not an iptables-restore operation", o)
}

// ByFamily splits an iptables transaction into one per address family
// (IPv4's first), each operation kept in its order; a transaction of one
// family (or of none, a native one) is itself.
func ByFamily(tx *ruleset.Tx) []*ruleset.Tx {
	var v4, v6 ruleset.Tx
	for _, o := range tx.Ops() {
		switch o.Table.Family {
		case ruleset.IP:
			v4.AppendOps(o)
		case ruleset.IP6:
			v6.AppendOps(o)
		default:
			return []*ruleset.Tx{tx}
		}
	}
	var out []*ruleset.Tx
	for _, part := range []*ruleset.Tx{&v4, &v6} {
		if !part.Empty() {
			out = append(out, part)
		}
	}
	return out
}

// Text renders tx for the tool that applies it (nft -f with nft, else
// iptables-restore, one payload per address family), for dry runs, logs
// and golden files; what cannot be rendered is a comment line naming why.
func Text(tx *ruleset.Tx, nft bool) string {
	if nft {
		s, err := NftScript(tx)
		if err != nil {
			return "# " + err.Error() + "\n"
		}
		return s
	}
	var b strings.Builder
	for _, part := range ByFamily(tx) {
		s, err := IPTablesRestore(part)
		if err != nil {
			return "# " + err.Error() + "\n"
		}
		b.WriteString(s)
	}
	return b.String()
}
