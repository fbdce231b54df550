package firewall

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/meshwire/meshwire/internal/nftnl"
)

// Rules appended over netlink (AppendRules) are given as typed values and
// encoded as iptables-nft encodes the iptables-restore line they stand for
// (internal/nftnl checks the bytes against iptables-nft itself). Only what
// meshwire appends is encodable:
//
//	[!] -s Src  [!] -d Dst  -m addrtype ! --dst-type MULTICAST
//	-m comment --comment Comment  -j MASQUERADE
//
// in an iptables table (Family IP or IP6), each part optional, in that
// order. A rule using any other field is refused.

// encodable is what encodeRule reads; the rest of a Rule must be zero.
func encodable(r Rule) Rule {
	r.Family, r.Table, r.Chain = 0, "", ""
	r.Src, r.NotSrc, r.Dst, r.NotDst = netip.Prefix{}, false, netip.Prefix{}, false
	r.NotDstMulticast, r.Comment = false, ""
	if r.Target == "MASQUERADE" {
		r.Target = ""
	}
	// Where a read rule was, not what it is.
	r.Handle, r.Position, r.Spec = 0, 0, ""
	return r
}

// encodeRule returns the rule to append for r.
func encodeRule(r Rule) (nftnl.NewRule, error) {
	if r.Family != IP && r.Family != IP6 {
		return nftnl.NewRule{}, fmt.Errorf("append to %s %s %s: only iptables tables (ip, ip6) are appended to", r.Family.Name(), r.Table, r.Chain)
	}
	if rest := encodable(r); rest != (Rule{}) {
		return nftnl.NewRule{}, fmt.Errorf("append to %s %s %s: the rule has fields that are not encoded (%+v)", r.Family.Name(), r.Table, r.Chain, rest)
	}
	fam := r.Family
	exprs, err := addrMatches(nil, fam, r)
	if err != nil {
		return nftnl.NewRule{}, err
	}
	if r.NotDstMulticast {
		exprs = append(exprs, nftnl.NotMulticastDst())
	}
	if r.Comment != "" {
		cm, err := nftnl.Comment(r.Comment)
		if err != nil {
			return nftnl.NewRule{}, err
		}
		exprs = append(exprs, cm)
	}
	exprs = append(exprs, nftnl.Counter())
	if r.Target == "MASQUERADE" {
		exprs = append(exprs, nftnl.Masquerade(fam))
	}
	return nftnl.NewRule{Family: fam, Table: r.Table, Chain: r.Chain, Exprs: exprs}, nil
}

// addrMatches appends to exprs r's [!] Src and [!] Dst matches for a table
// of family fam (IP or IP6), as iptables-nft and nft both encode them.
func addrMatches(exprs []nftnl.Expr, fam TableFamily, r Rule) ([]nftnl.Expr, error) {
	for _, m := range []struct {
		p           netip.Prefix
		dst, invert bool
	}{{r.Src, false, r.NotSrc}, {r.Dst, true, r.NotDst}} {
		if !m.p.IsValid() {
			continue
		}
		n, err := ipNet(fam, m.p)
		if err != nil {
			return nil, err
		}
		exprs = append(exprs, nftnl.AddrMatch(fam, m.dst, m.invert, n)...)
	}
	return exprs, nil
}

// ipNet is a prefix of the table's address family as a net.IPNet.
func ipNet(fam TableFamily, p netip.Prefix) (net.IPNet, error) {
	a := p.Addr()
	if a.Is4() != (fam == IP) || a.Is4In6() {
		return net.IPNet{}, fmt.Errorf("address %s in an %s table", p, fam.Name())
	}
	return net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(p.Bits(), a.BitLen())}, nil
}

// encodeRules encodes rules for one transaction.
func encodeRules(rules []Rule) ([]nftnl.NewRule, error) {
	out := make([]nftnl.NewRule, len(rules))
	for i, r := range rules {
		var err error
		if out[i], err = encodeRule(r); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// decodeAppended reads an encoded rule the way a netlink read would.
func decodeAppended(nr nftnl.NewRule) Rule {
	r := Rule{Family: nr.Family, Table: nr.Table, Chain: nr.Chain}
	decodeExprs(nftnl.EncodeExprs(nr.Exprs), &r)
	return r
}
