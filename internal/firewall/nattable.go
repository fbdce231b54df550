package firewall

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/nftnl"
)

// NatTable is a native nftables table of meshwire's own with one source
// NAT base chain (type nat hook postrouting priority srcnat), written whole
// in one transaction that replaces the table if it is there: ipMasq's
// table of one attachment. Host writes it over netlink, so a node with no
// firewall tool can have it; Script is the same table as an nft script
// (what the Fake applies, and the text the goldens hold).
type NatTable struct {
	Family  TableFamily // Inet
	Name    string
	Comment string
	Chain   string
	// Rules: IPFamily V4 or V6; Src, Dst (with NotDst), NotDstMulticast
	// and Target MASQUERADE, each optional. Nothing else is written.
	Rules []Rule
}

// natRule is the part of a rule a NatTable writes; the rest must be zero.
func natRule(r Rule) Rule {
	r.IPFamily, r.Src, r.Dst, r.NotDst, r.NotDstMulticast = 0, netip.Prefix{}, netip.Prefix{}, false, false
	if r.Target == "MASQUERADE" {
		r.Target = ""
	}
	return r
}

func (t NatTable) check() error {
	for _, r := range t.Rules {
		if r.IPFamily != V4 && r.IPFamily != V6 {
			return fmt.Errorf("table %s %s: a rule with no IP family", t.Family.Name(), t.Name)
		}
		if rest := natRule(r); rest != (Rule{}) {
			return fmt.Errorf("table %s %s: the rule has fields that are not written (%+v)", t.Family.Name(), t.Name, rest)
		}
		for _, p := range []netip.Prefix{r.Src, r.Dst} {
			if p.IsValid() && p.Addr().Is4() != (r.IPFamily == V4) {
				return fmt.Errorf("table %s %s: address %s in an IPv%d rule", t.Family.Name(), t.Name, p, r.IPFamily)
			}
		}
	}
	return nil
}

// multicast is each family's multicast range, for NotDstMulticast.
func multicast(f Family) netip.Prefix {
	if f == V6 {
		return netip.MustParsePrefix("ff00::/8")
	}
	return netip.MustParsePrefix("224.0.0.0/4")
}

// Script renders t as an nft script that replaces the table.
func (t NatTable) Script() (string, error) {
	if err := t.check(); err != nil {
		return "", err
	}
	fam := t.Family.Name()
	var b strings.Builder
	fmt.Fprintf(&b, "add table %s %s\ndelete table %s %s\n", fam, t.Name, fam, t.Name)
	fmt.Fprintf(&b, "table %s %s {\n\tcomment %q\n\tchain %s {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n", fam, t.Name, t.Comment, t.Chain)
	for _, r := range t.Rules {
		proto := "ip"
		if r.IPFamily == V6 {
			proto = "ip6"
		}
		var parts []string
		match := func(what string, p netip.Prefix, not bool) {
			op := ""
			if not {
				op = "!= "
			}
			v := p.String()
			if p.IsSingleIP() {
				v = p.Addr().String()
			}
			parts = append(parts, fmt.Sprintf("%s %s %s%s", proto, what, op, v))
		}
		if r.Src.IsValid() {
			match("saddr", r.Src, false)
		}
		if r.Dst.IsValid() {
			match("daddr", r.Dst, r.NotDst)
		}
		if r.NotDstMulticast {
			match("daddr", multicast(r.IPFamily), true)
		}
		if r.Target == "MASQUERADE" {
			parts = append(parts, "masquerade")
		}
		fmt.Fprintf(&b, "\t\t%s\n", strings.Join(parts, " "))
	}
	b.WriteString("\t}\n}\n")
	return b.String(), nil
}

// natExprs encodes a rule of a NatTable with the expressions nft generates
// for its statement.
func natExprs(r Rule) ([]nftnl.Expr, error) {
	fam := IP
	if r.IPFamily == V6 {
		fam = IP6
	}
	exprs, err := addrMatches(nftnl.MetaNfproto(fam), fam, r)
	if err != nil {
		return nil, err
	}
	if r.NotDstMulticast {
		n, _ := ipNet(fam, multicast(r.IPFamily))
		exprs = append(exprs, nftnl.AddrMatch(fam, true, true, n)...)
	}
	if r.Target == "MASQUERADE" {
		exprs = append(exprs, nftnl.Masq())
	}
	return exprs, nil
}

// ReplaceNatTable writes t over netlink in one transaction: no tool runs.
func (h *Host) ReplaceNatTable(_ context.Context, t NatTable) error {
	if err := t.check(); err != nil {
		return err
	}
	rules := make([][]nftnl.Expr, 0, len(t.Rules))
	for _, r := range t.Rules {
		exprs, err := natExprs(r)
		if err != nil {
			return err
		}
		rules = append(rules, exprs)
	}
	c, err := h.c()
	if err != nil {
		return err
	}
	return c.ReplaceTable(t.Family, t.Name, t.Comment, nftnl.BaseChain{Name: t.Chain, Type: "nat", Hook: unix.NF_INET_POST_ROUTING, Priority: 100}, rules)
}

// ReplaceNatTable applies t's Script.
func (f *Fake) ReplaceNatTable(ctx context.Context, t NatTable) error {
	script, err := t.Script()
	if err != nil {
		return err
	}
	return f.ApplyNft(ctx, script)
}
