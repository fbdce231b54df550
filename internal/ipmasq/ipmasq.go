// Package ipmasq sets up and removes the source NAT (masquerade) of a pod's
// addresses for the interface plugins' ipMasq option. It decides what the
// rules are and hands them to a firewall.Interface (the plugin resolves the
// backend and opens it): a call goes down once, plugin -> ipmasq ->
// firewall -> kernel.
//
// Everything installed for one attachment is named by package attachment,
// so that DEL and GC find exactly what is theirs. With iptables that is one
// MASQUERADE rule per pod address in the nat table's POSTROUTING, whose
// comment starts with the attachment's tag (attachment.ID.MasqTag) and names
// the network, container and interface: appended over netlink on an
// nf_tables-backed iptables once the nat table exists, else with one
// iptables-restore transaction per address family. With nftables it is a
// table inet (attachment.ID.MasqTable) holding its own postrouting NAT
// chain, so DEL is one idempotent table deletion.
package ipmasq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// comment describes the attachment in the rules, within nftables' 128
// bytes (the network name is limited by the CNI spec to letters, digits,
// '_', '.' and '-'; long names and ids are shortened: the hash identifies).
func comment(a attachment.ID) string {
	return fmt.Sprintf(commentPrefix+"%s net=%s id=%s if=%s", a.MasqTag(), sanitize(a.Network, 32), sanitize(a.ContainerID, 24), sanitize(a.IfName, 15))
}

// commentPrefix starts the comment of every masquerade rule.
const commentPrefix = "meshwire-masq "

func sanitize(s string, max int) string {
	if len(s) > max {
		s = s[:max]
	}
	return strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r < ' ' || r > '~' {
			return '_'
		}
		return r
	}, s)
}

// split sorts addresses by family, keeping the order given.
func split(addrs []net.IPNet) (v4, v6 []net.IPNet) {
	for _, a := range addrs {
		if a.IP.To4() != nil {
			v4 = append(v4, net.IPNet{IP: a.IP.To4(), Mask: a.Mask[len(a.Mask)-4:]})
		} else {
			v6 = append(v6, a)
		}
	}
	return v4, v6
}

// masqRule is the masquerade rule of one address: from the address,
// leaving the pod's subnet, not to multicast, tagged with the attachment.
// The iptables payloads render it, the nf_tables-backed append encodes
// it, and the native table (nftTable) holds its nft form.
func masqRule(a attachment.ID, ad net.IPNet) ruleset.Rule {
	f, bits := ruleset.V4, 32
	ip, ok := netip.AddrFromSlice(ad.IP.To4())
	if !ok {
		f, bits = ruleset.V6, 128
		ip, _ = netip.AddrFromSlice(ad.IP.To16())
	}
	ones, _ := ad.Mask.Size()
	if f == ruleset.V4 && len(ad.Mask) == net.IPv6len {
		ones -= 96
	}
	return ruleset.Rule{
		Family: f, Chain: natChain,
		Match: []ruleset.Match{
			{Kind: ruleset.MatchSrc, Prefix: netip.PrefixFrom(ip, bits)},
			{Kind: ruleset.MatchDst, Not: true, Prefix: netip.PrefixFrom(ip, ones).Masked()},
			{Kind: ruleset.MatchDstType, Not: true, Name: "MULTICAST"},
		},
		Comment: comment(a),
		Target:  ruleset.Target{Kind: ruleset.Masquerade},
	}
}

// natTable is the iptables nat table of family f.
func natTable(f ruleset.IPVersion) ruleset.TableID {
	return ruleset.TableID{Family: f.Tables(), Name: "nat"}
}

// AddTx is the transaction that masquerades addrs of attachment a: one
// rule per address appended to the nat table's POSTROUTING of its family
// (iptables-nft reads the whole table on every change, so fewer rules per
// pod make every pod's ADD and DEL cheaper). On an nf_tables-backed
// iptables the firewall appends them over netlink.
func AddTx(a attachment.ID, addrs []net.IPNet) *ruleset.Tx { return masqTx(ruleset.Add, a, addrs) }

// DelGuessTx is the removal of what AddTx installed for addrs, without
// reading the ruleset first: it fails (as a whole) when the rules are not
// exactly there, and the caller then finds them by their tag.
func DelGuessTx(a attachment.ID, addrs []net.IPNet) *ruleset.Tx {
	return masqTx(ruleset.Delete, a, addrs)
}

// masqTx adds (Add) or deletes (Delete) the rule of each address.
func masqTx(v ruleset.Verb, a attachment.ID, addrs []net.IPNet) *ruleset.Tx {
	tx := &ruleset.Tx{}
	for _, ad := range addrs {
		r := masqRule(a, ad)
		tx.AppendOps(ruleset.Op{Verb: v, Table: natTable(r.Family), Rule: &r})
	}
	return tx
}

// nftTable is the attachment's native table: its masquerade rules, IPv4
// first, in a table of its own, where nft matches multicast by prefix and
// the table, not each rule, carries the comment.
func nftTable(a attachment.ID, addrs []net.IPNet) ruleset.Table {
	v4, v6 := split(addrs)
	var rules []ruleset.Rule
	for _, ad := range append(v4, v6...) {
		r := masqRule(a, ad)
		mc := "224.0.0.0/4"
		if r.Family == ruleset.V6 {
			mc = "ff00::/8"
		}
		r.Match[2] = ruleset.Match{Kind: ruleset.MatchDst, Not: true, Prefix: netip.MustParsePrefix(mc)} // masqRule's multicast match
		for i := range r.Match {
			r.Match[i].Host = true // nft lists single addresses bare
		}
		r.Chain, r.Comment = "", ""
		rules = append(rules, r)
	}
	return ruleset.Table{
		Family: ruleset.Inet, Name: a.MasqTable(), Comment: comment(a),
		Chains: []ruleset.Chain{{
			Name:  "postrouting",
			Base:  &ruleset.BaseChain{Type: "nat", Hook: "postrouting", Priority: 100, PriorityName: "srcnat"},
			Rules: rules,
		}},
	}
}

// NftAdd renders the nft script that (re)creates the attachment's table.
func NftAdd(a attachment.ID, addrs []net.IPNet) string {
	return fwtext.NftReplaceTable(nftTable(a, addrs))
}

// The chain of the nat table that holds the masquerade rules.
const natChain = "POSTROUTING"

// families pairs each address family with its addresses.
func families(addrs []net.IPNet) []struct {
	f     ruleset.IPVersion
	addrs []net.IPNet
} {
	v4, v6 := split(addrs)
	return []struct {
		f     ruleset.IPVersion
		addrs []net.IPNet
	}{{ruleset.V4, v4}, {ruleset.V6, v6}}
}

// Available is STATUS for ipMasq on backend b: with native nftables,
// which Setup, Teardown and GC drive over netlink, nf_tables must answer
// (no tool is needed); else b's tools must work.
func Available(ctx context.Context, b firewall.Backend) error {
	if b.Kind == firewall.NFTables {
		return firewall.NetlinkAvailable()
	}
	return b.Available(ctx)
}

// Setup installs masquerading of addrs for attachment a. On an
// nf_tables-backed iptables the rules are appended over netlink (see
// firewall.Interface.Release for the socket that leaves behind).
func Setup(ctx context.Context, fw firewall.Interface, a attachment.ID, addrs []net.IPNet) error {
	if len(addrs) == 0 {
		return nil
	}
	b := fw.Backend()
	if b.Kind == firewall.NFTables {
		// Over netlink: no nft process, and none needed on the node.
		tx := (&ruleset.Tx{}).ReplaceTable(nftTable(a, addrs))
		if err := fw.Apply(ctx, tx); err != nil {
			return fmt.Errorf("ipMasq (nftables): %w", err)
		}
		return nil
	}
	if err := fw.Apply(ctx, AddTx(a, addrs)); err != nil {
		return fmt.Errorf("ipMasq (%s): %w", b, err)
	}
	return nil
}

// Teardown removes what Setup installed for a. Native nftables tables and
// the rules of an nf_tables-backed iptables are found and removed over
// netlink, in both families whatever addrs says. For legacy iptables,
// addrs, when known (from prevResult), let the common case go in one
// transaction per family without reading anything; without them (or when
// they do not match) the chain is read to find the attachment's rules by
// their tag. Nothing there is not an error.
func Teardown(ctx context.Context, fw firewall.Interface, a attachment.ID, addrs []net.IPNet) error {
	b := fw.Backend()
	if b.Kind == firewall.NFTables {
		tx := (&ruleset.Tx{}).DestroyTable(ruleset.TableID{Family: ruleset.Inet, Name: a.MasqTable()})
		if err := fw.Apply(ctx, tx); err != nil {
			return fmt.Errorf("ipMasq teardown (nftables): %w", err)
		}
		return nil
	}
	tag := a.MasqTag()
	var errs []error
	for _, fam := range families(addrs) {
		if !b.NFTablesBacked() {
			if len(fam.addrs) == 0 && len(addrs) > 0 {
				continue
			}
			if len(fam.addrs) > 0 && fw.Apply(ctx, DelGuessTx(a, fam.addrs)) == nil {
				continue
			}
		}
		if _, err := firewall.DeleteMatching(ctx, fw, fam.f.Tables(), "nat", natChain, func(r installed.Rule) bool {
			return commentTag(r.Comment) == tag
		}); err != nil {
			errs = append(errs, fmt.Errorf("ipMasq teardown (%s, IPv%d): %w", b, fam.f, err))
		}
	}
	return errors.Join(errs...)
}

// commentTag returns the attachment tag (MasqTag) of a meshwire-masq
// comment text, or "".
func commentTag(c string) string {
	rest, ok := strings.CutPrefix(c, commentPrefix)
	if !ok {
		return ""
	}
	if i := strings.IndexByte(rest, ' '); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// GC removes the masquerading of every attachment of network that is not in
// valid.
func GC(ctx context.Context, fw firewall.Interface, network string, valid []attachment.ID) error {
	keep := map[string]bool{}
	for _, v := range valid {
		v.Network = network
		keep[v.MasqTag()] = true
		keep[v.MasqTable()] = true
	}
	b := fw.Backend()
	if b.Kind == firewall.NFTables {
		tables, err := fw.Tables(ctx, ruleset.Inet)
		if err != nil {
			return fmt.Errorf("ipMasq GC (%s): %w", b, err)
		}
		tx := &ruleset.Tx{}
		for _, t := range tables {
			if strings.HasPrefix(t, attachment.MasqTablePrefix(network)) && !keep[t] {
				tx.DestroyTable(ruleset.TableID{Family: ruleset.Inet, Name: t})
			}
		}
		return fw.Apply(ctx, tx)
	}
	p := attachment.MasqTagPrefix(network)
	var errs []error
	for _, f := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
		if _, err := firewall.DeleteMatching(ctx, fw, f.Tables(), "nat", natChain, func(r installed.Rule) bool {
			t := commentTag(r.Comment)
			return strings.HasPrefix(t, p) && !keep[t]
		}); err != nil {
			errs = append(errs, fmt.Errorf("ipMasq GC (%s, IPv%d): %w", b, f, err))
		}
	}
	return errors.Join(errs...)
}

// Present reports whether the attachment's masquerading is installed for
// every family of addrs (CHECK).
func Present(ctx context.Context, fw firewall.Interface, a attachment.ID, addrs []net.IPNet) (bool, error) {
	if fw.Backend().Kind == firewall.NFTables {
		return fw.HasTable(ctx, ruleset.Inet, a.MasqTable())
	}
	tag := a.MasqTag()
	for _, fam := range families(addrs) {
		if len(fam.addrs) == 0 {
			continue
		}
		c, err := fw.ReadChain(ctx, fam.f.Tables(), "nat", natChain)
		if err != nil {
			return false, err
		}
		found := 0
		if c != nil {
			for _, r := range c.Rules {
				if commentTag(r.Comment) == tag && r.Target == "MASQUERADE" {
					found++
				}
			}
		}
		if found < len(fam.addrs) {
			return false, nil
		}
	}
	return true, nil
}
