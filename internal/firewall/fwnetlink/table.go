package fwnetlink

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Tables of meshwire's own (ruleset.Table: ipMasq's of an attachment,
// bridge's macspoof table) are written over netlink, in one transaction
// that replaces the table: no firewall tool runs, so a node with none can
// have them. Each rule is encoded with the expressions nft generates for
// its statement (the tests compare with what `nft -f` makes of Script).
// Only what those tables hold is encodable: address matches (inet, ip,
// ip6 tables), interface names, a bridge table's source MAC, and the
// masquerade, accept and drop targets.

// hooks are the netfilter hook numbers by name (the same in the bridge
// family).
var hooks = map[string]uint32{
	"prerouting":  unix.NF_INET_PRE_ROUTING,
	"input":       unix.NF_INET_LOCAL_IN,
	"forward":     unix.NF_INET_FORWARD,
	"output":      unix.NF_INET_LOCAL_OUT,
	"postrouting": unix.NF_INET_POST_ROUTING,
}

// tableExprs encodes the rules of t's one chain, or says what cannot be
// written.
func tableExprs(t ruleset.Table, c ruleset.Chain) ([][]nftnl.Expr, error) {
	out := make([][]nftnl.Expr, 0, len(c.Rules))
	for i, r := range c.Rules {
		exprs, err := tableRuleExprs(t.Family, r)
		if err != nil {
			return nil, fmt.Errorf("table %s %s, rule %d (%s): %w", t.Family, t.Name, i+1, fwtext.NftStatement(r), err)
		}
		out = append(out, exprs)
	}
	return out, nil
}

func tableRuleExprs(fam ruleset.Family, r ruleset.Rule) ([]nftnl.Expr, error) {
	var exprs []nftnl.Expr
	nfproto := false
	for _, m := range r.Match {
		switch m.Kind {
		case ruleset.MatchSrc, ruleset.MatchDst:
			af, v := ruleset.IP, ruleset.V4
			if m.Prefix.Addr().Is6() {
				af, v = ruleset.IP6, ruleset.V6
			}
			if r.Family != 0 && r.Family != v {
				return nil, fmt.Errorf("address %s in an IPv%d rule", m.Prefix, r.Family)
			}
			switch {
			case fam == ruleset.Inet && !nfproto:
				exprs, nfproto = append(exprs, nftnl.MetaNfproto(af)...), true
			case fam != ruleset.Inet && fam != af:
				return nil, fmt.Errorf("address %s in a %s table", m.Prefix, fam)
			}
			am, err := addrMatch(af, m)
			if err != nil {
				return nil, err
			}
			exprs = append(exprs, am...)
		case ruleset.MatchIn, ruleset.MatchOut:
			if m.Name == "" || len(m.Name) >= unix.IFNAMSIZ {
				return nil, fmt.Errorf("interface name %q", m.Name)
			}
			exprs = append(exprs, nftnl.IfnameMatch(m.Kind == ruleset.MatchOut, m.Not, m.Name)...)
		case ruleset.MatchEtherSrc:
			mac, err := net.ParseMAC(m.Name)
			if err != nil || len(mac) != 6 || fam != ruleset.Bridge {
				return nil, fmt.Errorf("source MAC %q (six bytes, in a bridge table)", m.Name)
			}
			exprs = append(exprs, nftnl.EtherSrcMatch(m.Not, mac)...)
		default:
			return nil, fmt.Errorf("a match of kind %d is not written over netlink", m.Kind)
		}
	}
	switch r.Target.Kind {
	case ruleset.Masquerade:
		exprs = append(exprs, nftnl.Masq())
	case ruleset.Drop:
		exprs = append(exprs, nftnl.Verdict(nfDrop))
	case ruleset.Accept:
		exprs = append(exprs, nftnl.Verdict(nfAccept))
	default:
		return nil, fmt.Errorf("a target of kind %d is not written over netlink", r.Target.Kind)
	}
	return exprs, nil
}

// ReplaceTable writes t over netlink in one transaction that replaces
// the table: no tool runs.
func ReplaceTable(c *nftnl.Conn, t ruleset.Table) error {
	rules, bc, err := CheckTable(t)
	if err != nil {
		return err
	}
	return c.ReplaceTable(t.Family, t.Name, t.Comment, bc, rules)
}

// CheckTable encodes t, a table with one base chain (what is written over
// netlink), or says why it cannot be.
func CheckTable(t ruleset.Table) ([][]nftnl.Expr, nftnl.BaseChain, error) {
	if len(t.Sets) > 0 {
		return nil, nftnl.BaseChain{}, fmt.Errorf("table %s %s: sets are not written over netlink", t.Family, t.Name)
	}
	if len(t.Chains) != 1 || t.Chains[0].Base == nil {
		return nil, nftnl.BaseChain{}, fmt.Errorf("table %s %s: one base chain is written over netlink, not %d chains", t.Family, t.Name, len(t.Chains))
	}
	c := t.Chains[0]
	hook, ok := hooks[c.Base.Hook]
	if !ok || c.Name == "" || c.Base.Type == "" {
		return nil, nftnl.BaseChain{}, fmt.Errorf("table %s %s: base chain %q of type %q on hook %q", t.Family, t.Name, c.Name, c.Base.Type, c.Base.Hook)
	}
	rules, err := tableExprs(t, c)
	return rules, nftnl.BaseChain{Name: c.Name, Type: c.Base.Type, Hook: hook, Priority: int32(c.Base.Priority)}, err
}
