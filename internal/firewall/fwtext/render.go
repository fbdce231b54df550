package fwtext

import (
	"strings"

	"github.com/meshwire/meshwire/internal/ruleset"
)

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
