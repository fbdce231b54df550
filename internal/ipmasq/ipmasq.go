// Package ipmasq sets up and removes the source NAT (masquerade) of a pod's
// addresses for the interface plugins' ipMasq option, through the shared
// firewall backends: one iptables-restore transaction per address family, or
// one nft transaction.
//
// Everything installed for one attachment is named after two hashes, so that
// DEL and GC find exactly what is theirs: the network's (8 hex digits of
// sha256(network name)) and the attachment's (sha256(containerID "/" ifName),
// the same hash that names the pod's host veth). With iptables that is one
// MASQUERADE rule per pod address in the nat table's POSTROUTING, whose
// comment starts with the tag MW-<net>-<att> and names the network,
// container and interface; with nftables it is a table inet
// meshwire_masq_<net>_<att> holding its own postrouting NAT chain, so DEL is
// one idempotent "add table; delete table" transaction.
package ipmasq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/meshwire/meshwire/internal/firewall"
)

// Attachment identifies one pod interface on one network.
type Attachment struct {
	Network     string
	ContainerID string
	IfName      string
}

// NetHash is the network's part of the names.
func NetHash(network string) string {
	s := sha256.Sum256([]byte(network))
	return hex.EncodeToString(s[:])[:8]
}

// AttHash is the attachment's part of the names (the container id hash).
func AttHash(containerID, ifName string) string {
	s := sha256.Sum256([]byte(containerID + "/" + ifName))
	return hex.EncodeToString(s[:])[:15]
}

// Chain is the attachment's tag in iptables: the first word of its rules'
// comment (the name of a chain in earlier designs, and of the same shape).
func (a Attachment) Chain() string { return chainPrefix(a.Network) + AttHash(a.ContainerID, a.IfName) }

// Table is the nftables table of an attachment.
func (a Attachment) Table() string { return tablePrefix(a.Network) + AttHash(a.ContainerID, a.IfName) }

func chainPrefix(network string) string { return "MW-" + NetHash(network) + "-" }
func tablePrefix(network string) string { return "meshwire_masq_" + NetHash(network) + "_" }

// comment describes the attachment in the rules, within nftables' 128
// bytes (the network name is limited by the CNI spec to letters, digits,
// '_', '.' and '-'; long names and ids are shortened: the hash identifies).
func (a Attachment) comment() string {
	return fmt.Sprintf(commentPrefix+"%s net=%s id=%s if=%s", a.Chain(), sanitize(a.Network, 32), sanitize(a.ContainerID, 24), sanitize(a.IfName, 15))
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

func host(ip net.IP) string {
	if ip.To4() != nil {
		return ip.String() + "/32"
	}
	return ip.String() + "/128"
}

func subnet(a net.IPNet) string {
	return (&net.IPNet{IP: a.IP.Mask(a.Mask), Mask: a.Mask}).String()
}

// ipRule is the masquerade rule of one address: leaving the pod's subnet,
// not to multicast.
func ipRule(a Attachment, ad net.IPNet) string {
	return fmt.Sprintf("POSTROUTING -s %s ! -d %s -m addrtype ! --dst-type MULTICAST -m comment --comment \"%s\" -j MASQUERADE", host(ad.IP), subnet(ad), a.comment())
}

// IPTablesAdd renders the iptables-restore payload that masquerades addrs
// (all of one family) of attachment a: one rule per address in the nat
// table's POSTROUTING (iptables-nft reads the whole table on every change, so
// fewer rules per pod make every pod's ADD and DEL cheaper).
func IPTablesAdd(a Attachment, addrs []net.IPNet) string { return ipPayload("-A", a, addrs) }

// IPTablesDelGuess renders the removal of what IPTablesAdd installed for
// addrs, without reading the ruleset first: it fails (as a whole) when the
// rules are not exactly there, and the caller then falls back to IPTablesDel
// on the saved ruleset.
func IPTablesDelGuess(a Attachment, addrs []net.IPNet) string { return ipPayload("-D", a, addrs) }

func ipPayload(op string, a Attachment, addrs []net.IPNet) string {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, ad := range addrs {
		b.WriteString(op + " " + ipRule(a, ad) + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// tagOf returns the attachment tag (Chain) in a saved rule's meshwire-masq
// comment, or "".
func tagOf(line string) string {
	const marker = `--comment "` + commentPrefix
	i := strings.Index(line, marker)
	if i < 0 {
		return ""
	}
	rest := line[i+len(marker):]
	if j := strings.IndexAny(rest, ` "`); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// IPTablesDel renders the removal of every rule whose tag is in tags, found
// in save, the iptables-save output of the nat table. It returns "" when
// none is there.
func IPTablesDel(save string, tags map[string]bool) string {
	var dels []string
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "-A ") && tags[tagOf(line)] {
			dels = append(dels, "-D "+strings.TrimPrefix(line, "-A "))
		}
	}
	if len(dels) == 0 {
		return ""
	}
	return "*nat\n" + strings.Join(dels, "\n") + "\nCOMMIT\n"
}

// IPTablesTags lists the attachment tags of network found in save.
func IPTablesTags(save, network string) []string {
	p := chainPrefix(network)
	seen := map[string]bool{}
	var out []string
	for _, line := range strings.Split(save, "\n") {
		if t := tagOf(line); strings.HasPrefix(t, p) && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}

// NftAdd renders the nft script that (re)creates the attachment's table.
func NftAdd(a Attachment, addrs []net.IPNet) string {
	t := a.Table()
	v4, v6 := split(addrs)
	var b strings.Builder
	fmt.Fprintf(&b, "add table inet %s\ndelete table inet %s\n", t, t)
	fmt.Fprintf(&b, "table inet %s {\n\tcomment \"%s\"\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n", t, a.comment())
	for _, ad := range v4 {
		fmt.Fprintf(&b, "\t\tip saddr %s ip daddr != %s ip daddr != 224.0.0.0/4 masquerade\n", ad.IP, subnet(ad))
	}
	for _, ad := range v6 {
		fmt.Fprintf(&b, "\t\tip6 saddr %s ip6 daddr != %s ip6 daddr != ff00::/8 masquerade\n", ad.IP, subnet(ad))
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// Setup installs masquerading of addrs for attachment a. On iptables-nft
// the rules are appended over netlink, and the returned file, when not nil,
// is the netlink socket, whose last close can wait for the kernel (see
// firewall.Conn.Release): the caller hands it to a detached process or
// closes it.
func Setup(ctx context.Context, b firewall.Backend, a Attachment, addrs []net.IPNet) (*os.File, error) {
	if len(addrs) == 0 {
		return nil, nil
	}
	if b.Kind == firewall.NFTables {
		if err := firewall.NftApply(ctx, NftAdd(a, addrs)); err != nil {
			return nil, fmt.Errorf("ipMasq (nftables): %w", err)
		}
		return nil, nil
	}
	if b.NFTablesBacked() {
		tail, err := appendRules(a, addrs)
		if err == nil {
			return tail, nil
		}
		// The usual reason: iptables-nft has not made the nat table yet.
		slog.Debug("ipMasq over netlink not done, using the tools", "error", err)
	}
	v4, v6 := split(addrs)
	for _, fam := range []struct {
		f     firewall.Family
		addrs []net.IPNet
	}{{firewall.V4, v4}, {firewall.V6, v6}} {
		if len(fam.addrs) == 0 {
			continue
		}
		if err := b.Restore(ctx, fam.f, IPTablesAdd(a, fam.addrs)); err != nil {
			return nil, fmt.Errorf("ipMasq (%s, IPv%d): %w", b, fam.f, err)
		}
	}
	return nil, nil
}

// appendRules appends the rules IPTablesAdd describes over netlink, all in
// one transaction, encoded as iptables-nft encodes them; see Setup for the
// file returned.
func appendRules(a Attachment, addrs []net.IPNet) (*os.File, error) {
	cm, err := firewall.Comment(a.comment())
	if err != nil {
		return nil, err
	}
	var rules []firewall.NewRule
	for _, ad := range addrs {
		f, hostNet := firewall.V4, net.IPNet{IP: ad.IP.To4(), Mask: net.CIDRMask(32, 32)}
		if hostNet.IP == nil {
			f, hostNet = firewall.V6, net.IPNet{IP: ad.IP, Mask: net.CIDRMask(128, 128)}
		}
		sub := net.IPNet{IP: ad.IP.Mask(ad.Mask), Mask: ad.Mask}
		exprs := append(firewall.AddrMatch(f, false, false, hostNet), firewall.AddrMatch(f, true, true, sub)...)
		exprs = append(exprs, firewall.NotMulticastDst(), cm, firewall.Counter(), firewall.Masquerade(f))
		rules = append(rules, firewall.NewRule{Family: f, Table: natTable, Chain: natChain, Exprs: exprs})
	}
	c, err := firewall.Open()
	if err != nil {
		return nil, err
	}
	err = c.AppendRules(rules)
	tail := c.Release()
	if err != nil && tail != nil {
		tail.Close()
		tail = nil
	}
	return tail, err
}

// Teardown removes what Setup installed for a. Native nftables tables and
// the rules of iptables-nft are removed over netlink, without starting a
// tool, from both families whatever addrs says; the returned file, when not
// nil, is the netlink socket whose last close waits for the kernel to free
// the removed rules (see firewall.Conn.Release): the caller hands it to a
// detached process or closes it. For iptables-legacy, addrs, when known
// (from prevResult), let the common case go in one transaction per family;
// without them (or when they do not match) the ruleset is read to find the
// attachment's rules by name. Nothing there is not an error.
func Teardown(ctx context.Context, b firewall.Backend, a Attachment, addrs []net.IPNet) (*os.File, error) {
	if b.Kind == firewall.NFTables || b.NFTablesBacked() {
		c, err := firewall.Open()
		if err == nil {
			if b.Kind == firewall.NFTables {
				err = c.DeleteTables(firewall.Inet, []string{a.Table()})
			} else {
				err = deleteTags(c, func(tag string) bool { return tag == a.Chain() })
			}
			tail := c.Release()
			if err == nil {
				return tail, nil
			}
			if tail != nil {
				_ = tail.Close()
			}
		}
		if b.Kind == firewall.NFTables {
			return nil, fmt.Errorf("ipMasq teardown (nftables): %w", err)
		}
		slog.Info("ipMasq teardown over netlink failed, using the tools", "error", err)
	}
	v4, v6 := split(addrs)
	var errs []error
	for _, fam := range []struct {
		f     firewall.Family
		addrs []net.IPNet
	}{{firewall.V4, v4}, {firewall.V6, v6}} {
		if len(fam.addrs) > 0 || len(addrs) == 0 {
			errs = append(errs, removeRules(ctx, b, fam.f, map[string]bool{a.Chain(): true}, IPTablesDelGuess(a, fam.addrs), len(fam.addrs) > 0))
		}
	}
	return nil, errors.Join(errs...)
}

// The chain of the nat table that holds the masquerade rules.
const natTable, natChain = "nat", "POSTROUTING"

// deleteTags removes, over c, the iptables-nft masquerade rules of both
// families whose tag sel accepts.
func deleteTags(c *firewall.Conn, sel func(tag string) bool) error {
	var errs []error
	for _, f := range []firewall.Family{firewall.V4, firewall.V6} {
		if _, err := c.DeleteTagged(f, natTable, natChain, func(cm string) bool { return sel(commentTag(cm)) }); err != nil {
			errs = append(errs, fmt.Errorf("IPv%d: %w", f, err))
		}
	}
	return errors.Join(errs...)
}

// commentTag returns the attachment tag (Chain) of a meshwire-masq comment
// text, or "".
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

func removeRules(ctx context.Context, b firewall.Backend, f firewall.Family, chains map[string]bool, guess string, tryGuess bool) error {
	if tryGuess {
		if err := b.Restore(ctx, f, guess); err == nil {
			return nil
		}
	}
	save, err := b.Save(ctx, f, "nat")
	if err != nil {
		return fmt.Errorf("ipMasq teardown (%s, IPv%d): %w", b, f, err)
	}
	payload := IPTablesDel(save, chains)
	if payload == "" {
		return nil
	}
	if err := b.Restore(ctx, f, payload); err != nil {
		return fmt.Errorf("ipMasq teardown (%s, IPv%d): %w", b, f, err)
	}
	return nil
}

// GC removes the masquerading of every attachment of network that is not in
// valid, on backend b.
func GC(ctx context.Context, b firewall.Backend, network string, valid []Attachment) error {
	keep := map[string]bool{}
	for _, v := range valid {
		v.Network = network
		keep[v.Chain()] = true
		keep[v.Table()] = true
	}
	if b.Kind == firewall.NFTables || b.NFTablesBacked() {
		c, err := firewall.Open()
		if err != nil {
			return fmt.Errorf("ipMasq GC (%s): %w", b, err)
		}
		defer c.Close()
		if b.Kind == firewall.NFTables {
			tables, err := c.Tables(firewall.Inet)
			if err != nil {
				return fmt.Errorf("ipMasq GC (%s): %w", b, err)
			}
			var stale []string
			for _, t := range tables {
				if strings.HasPrefix(t, tablePrefix(network)) && !keep[t] {
					stale = append(stale, t)
				}
			}
			return c.DeleteTables(firewall.Inet, stale)
		}
		p := chainPrefix(network)
		if err := deleteTags(c, func(t string) bool { return strings.HasPrefix(t, p) && !keep[t] }); err != nil {
			return fmt.Errorf("ipMasq GC (%s): %w", b, err)
		}
		return nil
	}
	var errs []error
	for _, f := range []firewall.Family{firewall.V4, firewall.V6} {
		save, err := b.Save(ctx, f, "nat")
		if err != nil {
			errs = append(errs, fmt.Errorf("ipMasq GC (%s, IPv%d): %w", b, f, err))
			continue
		}
		stale := map[string]bool{}
		for _, c := range IPTablesTags(save, network) {
			if !keep[c] {
				stale[c] = true
			}
		}
		if len(stale) == 0 {
			continue
		}
		if err := b.Restore(ctx, f, IPTablesDel(save, stale)); err != nil {
			errs = append(errs, fmt.Errorf("ipMasq GC (%s, IPv%d): %w", b, f, err))
		}
	}
	return errors.Join(errs...)
}

// Present reports whether the attachment's masquerading is installed for
// every family of addrs (CHECK).
func Present(ctx context.Context, b firewall.Backend, a Attachment, addrs []net.IPNet) (bool, error) {
	if b.Kind == firewall.NFTables {
		c, err := firewall.Open()
		if err != nil {
			return false, err
		}
		defer c.Close()
		tables, err := c.Tables(firewall.Inet)
		if err != nil {
			return false, err
		}
		return slices.Contains(tables, a.Table()), nil
	}
	v4, v6 := split(addrs)
	for _, fam := range []struct {
		f firewall.Family
		n int
	}{{firewall.V4, len(v4)}, {firewall.V6, len(v6)}} {
		if fam.n == 0 {
			continue
		}
		found, err := countRules(ctx, b, fam.f, a.Chain())
		if err != nil {
			return false, err
		}
		if found < fam.n {
			return false, nil
		}
	}
	return true, nil
}

// countRules counts the MASQUERADE rules tagged tag in family f.
func countRules(ctx context.Context, b firewall.Backend, f firewall.Family, tag string) (int, error) {
	found := 0
	if b.NFTablesBacked() {
		rules, err := readRules(f)
		if err == nil {
			for _, r := range rules {
				if commentTag(r.Comment) == tag && r.Target == "MASQUERADE" {
					found++
				}
			}
			return found, nil
		}
		slog.Info("reading masquerade rules over netlink failed, using the tools", "error", err)
	}
	save, err := b.Save(ctx, f, natTable)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(save, "\n") {
		if tagOf(line) == tag && strings.HasSuffix(strings.TrimSpace(line), "-j MASQUERADE") {
			found++
		}
	}
	return found, nil
}

// readRules reads the nat POSTROUTING rules of family f over netlink.
func readRules(f firewall.Family) ([]firewall.Rule, error) {
	c, err := firewall.Open()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ChainRules(f, natTable, natChain)
}
