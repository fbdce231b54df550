package intercept

import (
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// LegacyNftTable is the table (one per family, ip and ip6) where earlier
// meshwire versions kept their native nftables rules: removed when found.
const LegacyNftTable = "meshwire_intercept"

// nftTableName is the inet table holding an iptables table's rules.
func nftTableName(table string) string {
	for _, nt := range NftTables {
		if nt.Table == table {
			return nt.Name
		}
	}
	return ""
}

// Nft is the nftables rule set (BuildNft) as one transaction: each of
// istio's tables is removed if there (istio-nftables flushes them: the
// same), then those with rules written anew, each with a comment naming
// the rule set's fingerprint. An empty rule set only removes the tables
// (cleanup).
//
// One deliberate difference from istio-nftables: a TPROXY rule is
// followed by the same match with a drop. iptables' TPROXY target drops a
// packet that finds no proxy socket, nft's tproxy lets it go on to the
// application (so with istio-nftables, connections reach the application
// around the proxy while it is not listening); the drop keeps nftables as
// fail-closed as iptables (docs/reference-differences.md).
func Nft(rs *RuleSet) *ruleset.Tx {
	tx := &ruleset.Tx{}
	for _, nt := range NftTables {
		tx.DestroyTable(ruleset.TableID{Family: ruleset.Inet, Name: nt.Name})
	}
	tag := TagFor(rs.Fingerprint())
	for _, nt := range NftTables {
		t := rs.Table(nt.Table)
		if t == nil {
			continue
		}
		def := ruleset.Table{Family: ruleset.Inet, Name: nt.Name, Comment: tag}
		for _, c := range t.Chains {
			ch := ruleset.Chain{Name: NftChain(c)}
			if base, ok := ruleset.IPTablesHook(t.Name, c); ok {
				ch.Base = &base
			}
			for _, r := range nftRules(t, c) {
				r.Chain, r.Counter = ch.Name, true
				if r.Target.Kind == ruleset.Jump {
					r.Target.Chain = NftChain(r.Target.Chain)
				}
				ch.Rules = append(ch.Rules, r)
			}
			def.Chains = append(def.Chains, ch)
		}
		tx.AddTable(def)
	}
	return tx
}

// nftRules are the rules Nft writes into chain c of t: the chain's rules,
// each TPROXY rule followed by its drop.
func nftRules(t *TableRules, c string) []ruleset.Rule {
	var out []ruleset.Rule
	for _, r := range t.Rules {
		if r.Chain != c {
			continue
		}
		out = append(out, r)
		if r.Target.Kind == ruleset.TProxy {
			d := r
			d.Target = ruleset.Target{Kind: ruleset.Drop}
			out = append(out, d)
		}
	}
	return out
}

// NftLegacyRemoval removes the tables of earlier meshwire versions, for
// the families given.
func NftLegacyRemoval(fams ...Family) *ruleset.Tx {
	tx := &ruleset.Tx{}
	for _, f := range fams {
		tx.DestroyTable(ruleset.TableID{Family: f.Tables(), Name: LegacyNftTable})
	}
	return tx
}

// NftStatus compares istio's inet tables as read back through the firewall
// (by name; absent ones missing or nil) with the desired rule set: each
// table's comment names the fingerprint of the rule set written, and each
// chain must hold the rules Nft writes into it (so that a chain emptied
// behind meshwire's back is noticed).
func NftStatus(desired *RuleSet, have map[string]*installed.Table) Status {
	present := 0
	for _, t := range have {
		if t != nil {
			present++
		}
	}
	if present == 0 {
		if desired.Empty() {
			return Current
		}
		return Absent
	}
	tag := TagFor(desired.Fingerprint())
	for _, nt := range NftTables {
		got, want := have[nt.Name], desired.Table(nt.Table)
		if (got == nil) != (want == nil) {
			return Different
		}
		if got == nil {
			continue
		}
		if got.Comment != tag || len(got.Chains) != len(want.Chains) {
			return Different
		}
		for _, c := range want.Chains {
			gc := got.Chain(NftChain(c))
			if gc == nil || len(gc.Rules) != len(nftRules(want, c)) {
				return Different
			}
		}
	}
	return Current
}
