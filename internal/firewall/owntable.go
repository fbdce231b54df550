package firewall

import (
	"context"
	"fmt"
	"net"

	"golang.org/x/sys/unix"

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

// tableExprs encodes t's rules, or says what cannot be written.
func tableExprs(t ruleset.Table) ([][]nftnl.Expr, error) {
	out := make([][]nftnl.Expr, 0, len(t.Rules))
	for i, r := range t.Rules {
		exprs, err := tableRuleExprs(t.Family, r)
		if err != nil {
			return nil, fmt.Errorf("table %s %s, rule %d (%s): %w", t.Family, t.Name, i+1, r.Statement(), err)
		}
		out = append(out, exprs)
	}
	return out, nil
}

func tableRuleExprs(fam TableFamily, r ruleset.Rule) ([]nftnl.Expr, error) {
	var exprs []nftnl.Expr
	nfproto := false
	for _, m := range r.Match {
		switch m.Kind {
		case ruleset.MatchSrc, ruleset.MatchDst:
			af, v := IP, ruleset.V4
			if m.Prefix.Addr().Is6() {
				af, v = IP6, ruleset.V6
			}
			if r.Family != 0 && r.Family != v {
				return nil, fmt.Errorf("address %s in an IPv%d rule", m.Prefix, r.Family)
			}
			switch {
			case fam == Inet && !nfproto:
				exprs, nfproto = append(exprs, nftnl.MetaNfproto(af)...), true
			case fam != Inet && fam != af:
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
			if err != nil || len(mac) != 6 || fam != Bridge {
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

// ReplaceTable writes t over netlink in one transaction: no tool runs.
func (h *Host) ReplaceTable(_ context.Context, t ruleset.Table) error {
	rules, hook, err := checkTable(t)
	if err != nil {
		return err
	}
	c, err := h.c()
	if err != nil {
		return err
	}
	bc := nftnl.BaseChain{Name: t.Chain.Name, Type: t.Chain.Type, Hook: hook, Priority: int32(t.Chain.Priority)}
	return c.ReplaceTable(t.Family, t.Name, t.Comment, bc, rules)
}

// checkTable encodes t's rules and finds its chain's hook.
func checkTable(t ruleset.Table) ([][]nftnl.Expr, uint32, error) {
	hook, ok := hooks[t.Chain.Hook]
	if !ok || t.Chain.Name == "" || t.Chain.Type == "" {
		return nil, 0, fmt.Errorf("table %s %s: base chain %q of type %q on hook %q", t.Family, t.Name, t.Chain.Name, t.Chain.Type, t.Chain.Hook)
	}
	rules, err := tableExprs(t)
	return rules, hook, err
}

// ReplaceTable puts t in place as the kernel would, from the typed table:
// each rule is kept as a netlink read of its encoding gives it back, with
// its statement as Spec (as for the Fake's other nftables rules).
func (f *Fake) ReplaceTable(_ context.Context, t ruleset.Table) error {
	rules, _, err := checkTable(t)
	if err != nil {
		return err
	}
	return f.tx("replace-table", func(state map[tableKey]*fakeTable) error {
		ft := &fakeTable{comment: t.Comment}
		c := &Chain{Family: t.Family, Table: t.Name, Name: t.Chain.Name, Hook: t.Chain.Hook}
		ft.chains = []*Chain{c}
		for i, exprs := range rules {
			r := Rule{Family: t.Family}
			decodeExprs(nftnl.EncodeExprs(exprs), &r)
			r.Spec = t.Rules[i].Statement()
			if err := ft.addRule(c, r, -1); err != nil {
				return err
			}
		}
		state[tableKey{t.Family, t.Name}] = ft
		return nil
	})
}
