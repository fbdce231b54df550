package fwnetlink

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Rules appended over netlink (Encode, for Tx.AddRule) are given as typed rules
// (ruleset.Rule) and encoded as iptables-nft encodes their iptables-restore
// line (internal/nftnl checks the bytes against iptables-nft itself). Only
// what meshwire appends is encodable:
//
//	[!] -s Src  [!] -d Dst  -m addrtype ! --dst-type MULTICAST
//	-m comment --comment Comment  -j MASQUERADE
//
// in an iptables table of the rule's family (V4: ip, V6: ip6), each match
// optional, in that order. A rule with any other match or target is
// refused.

// encodeRule returns the rule to append for r, in table of r's family.
func encodeRule(table string, r ruleset.Rule) (nftnl.NewRule, error) {
	fam := r.Family.Tables()
	where := fmt.Sprintf("append to %s %s %s", fam.Name(), table, r.Chain)
	if r.Family != ruleset.V4 && r.Family != ruleset.V6 {
		return nftnl.NewRule{}, fmt.Errorf("append to table %s %s: a rule of no IP family (only iptables tables, ip and ip6, are appended to)", table, r.Chain)
	}
	var exprs []nftnl.Expr
	rank := 0 // the order above: src, dst, addrtype
	for _, m := range r.Match {
		var next int
		switch {
		case m.Kind == ruleset.MatchSrc:
			next = 1
		case m.Kind == ruleset.MatchDst:
			next = 2
		case m.Kind == ruleset.MatchDstType && m.Not && m.Name == "MULTICAST":
			next = 3
		default:
			return nftnl.NewRule{}, fmt.Errorf("%s: a match of kind %d (%s) is not encoded", where, m.Kind, fwtext.IPTablesSpec(r))
		}
		if next <= rank {
			return nftnl.NewRule{}, fmt.Errorf("%s: matches out of iptables' order (%s)", where, fwtext.IPTablesSpec(r))
		}
		rank = next
		if next == 3 {
			exprs = append(exprs, nftnl.NotMulticastDst())
			continue
		}
		am, err := addrMatch(fam, m)
		if err != nil {
			return nftnl.NewRule{}, fmt.Errorf("%s: %w", where, err)
		}
		exprs = append(exprs, am...)
	}
	if r.Comment != "" {
		cm, err := nftnl.Comment(r.Comment)
		if err != nil {
			return nftnl.NewRule{}, fmt.Errorf("%s: %w", where, err)
		}
		exprs = append(exprs, cm)
	}
	exprs = append(exprs, nftnl.Counter())
	if r.Target.Kind != ruleset.Masquerade {
		return nftnl.NewRule{}, fmt.Errorf("%s: a target of kind %d (%s) is not encoded", where, r.Target.Kind, fwtext.IPTablesSpec(r))
	}
	exprs = append(exprs, nftnl.Masquerade(fam))
	return nftnl.NewRule{Family: fam, Table: table, Chain: r.Chain, Exprs: exprs}, nil
}

// addrMatch encodes a source or destination address match (m.Kind
// MatchSrc or MatchDst) for family fam (IP or IP6), as iptables-nft and
// nft both encode it.
func addrMatch(fam ruleset.Family, m ruleset.Match) ([]nftnl.Expr, error) {
	n, err := ipNet(fam, m.Prefix)
	if err != nil {
		return nil, err
	}
	return nftnl.AddrMatch(fam, m.Kind == ruleset.MatchDst, m.Not, n), nil
}

// ipNet is a prefix of the table's address family as a net.IPNet.
func ipNet(fam ruleset.Family, p netip.Prefix) (net.IPNet, error) {
	a := p.Addr()
	if a.Is4() != (fam == ruleset.IP) || a.Is4In6() {
		return net.IPNet{}, fmt.Errorf("address %s in an %s table", p, fam.Name())
	}
	return net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(p.Bits(), a.BitLen())}, nil
}

// encodeRules encodes rules for one transaction.
func encodeRules(table string, rules []ruleset.Rule) ([]nftnl.NewRule, error) {
	out := make([]nftnl.NewRule, len(rules))
	for i, r := range rules {
		var err error
		if out[i], err = encodeRule(table, r); err != nil {
			return nil, err
		}
	}
	return out, nil
}
