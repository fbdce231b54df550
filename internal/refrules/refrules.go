// Package refrules removes, at meshwire's DEL and GC, the firewall objects
// the reference plugins (github.com/containernetworking/plugins v1.9.1 and
// Debian's 1.1.1) made for pods they set up before the node switched to
// meshwire in place. The reference's DEL will never run for those pods, so
// meshwire's does what it would have done. The names are in
// internal/attachment (reference.go).
//
// What goes, per attachment (network, container id, interface):
//
//	feature  form            objects                                           DEL  GC
//	ipMasq   iptables (both  nat chain CNI-<hash(net+id)> and the POSTROUTING  yes  yes (by the jump's comment
//	         variants, v4/6) jumps to it                                            name: "<net>" id: "<id>")
//	ipMasq   nftables        rules of inet cni_plugins_masquerade masq_checks  yes  yes (the reference's own GC:
//	         (v1.9.1)        whose comment starts with the attachment's key         network-hash prefix, valid
//	                                                                                 comments kept)
//	portmap  iptables        nat chains CNI-DN-<hash> (and the CNI-SN-<hash>   yes  yes (CNI-DN only, by the jump's
//	                         of releases before 0.7) and their jumps from           comment dnat name: "<net>"
//	                         CNI-HOSTPORT-DNAT (-SNAT)                               id: "<id>")
//	portmap  nftables        rules of ip/ip6 cni_hostport (hostports,           yes  no: their comment is the
//	         (v1.9.1)        hostip_hostports, masquerading) whose comment           container id alone, no
//	                         is the container id                                     network to keep GC within
//
// The reference removes exactly these at DEL (its iptables ipMasq ignores
// the interface: the chain is per network and container) and implements
// GC in none of its plugins (pkg/ip has GCIPMasqForNetwork for nftables,
// which no plugin calls); meshwire's GC removes what it can attribute to
// the network. Beyond the reference, the shared objects that are left
// holding nothing go too, so that a node ends with nothing of the
// reference's: the cni_plugins_masquerade table once masq_checks is
// empty, a cni_hostport table once its three chains are empty, and the
// CNI-HOSTPORT-DNAT, -SNAT, -SETMARK and -MASQ chains (with their jumps
// from PREROUTING, OUTPUT and POSTROUTING) once no CNI-DN or CNI-SN chain
// is left. That removal is best effort: after the switch no reference
// plugin adds to them.
//
// DEL pays for this on every call, also on nodes that never ran the
// reference, so it first asks cheaply whether anything of the attachment
// is there and stops when not: per family, one getsockopt on the legacy
// nat table (none when legacy iptables was never used) and one netlink
// get of the chain for iptables-nft, one netlink get of the table for
// nftables. Everything runs in the calling thread's network namespace.
package refrules

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Each function works through fw's siblings (firewall.Host.Sibling), one
// per form the reference may have written, so that the caller's one netlink
// connection serves meshwire's own rules and the reference's: the caller's
// Release then hands over (or closes) that one socket.

// DelMasq removes what the reference's ipMasq (bridge, ptp) set up for
// one attachment, in every form.
func DelMasq(ctx context.Context, fw *firewall.Host, r attachment.Reference) error {
	return hostNode(fw).delMasq(ctx, r)
}

// GCMasq removes the reference's ipMasq objects of network whose
// attachment is not in valid.
func GCMasq(ctx context.Context, fw *firewall.Host, network string, valid []types.GCAttachment) error {
	return hostNode(fw).gcMasq(ctx, network, valid)
}

// DelPortmap removes what the reference's portmap set up for one
// attachment (network and container id), in every form.
func DelPortmap(ctx context.Context, fw *firewall.Host, r attachment.Reference) error {
	return hostNode(fw).delPortmap(ctx, r)
}

// GCPortmap removes the reference's iptables portmap chains of network
// whose attachment is not in valid (see the package doc for nftables).
func GCPortmap(ctx context.Context, fw *firewall.Host, network string, valid []types.GCAttachment) error {
	return hostNode(fw).gcPortmap(ctx, network, valid)
}

// node is the host's firewall in the forms the reference may have
// written: legacy iptables, and nf_tables (iptables-nft's tables and the
// native tables, both over one netlink connection).
type node struct {
	legacy, nft firewall.Interface
}

func hostNode(fw *firewall.Host) *node {
	return &node{
		legacy: fw.Sibling(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantLegacy}),
		nft:    fw.Sibling(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT}),
	}
}

var families = []ruleset.IPVersion{ruleset.V4, ruleset.V6}

// iptForms are the iptables variants, legacy first.
func (n *node) iptForms() []firewall.Interface { return []firewall.Interface{n.legacy, n.nft} }

// hasChains is the cheap check: which of chains the nat table of family f
// holds. Legacy iptables lists every chain of the table for the price of
// one (ChainNames: one getsockopt, nothing when nat was never loaded);
// nf_tables answers each chain with one request, which costs the same
// however many chains the node has (HasChain).
func hasChains(ctx context.Context, fw firewall.Interface, f ruleset.IPVersion, chains ...string) (map[string]bool, error) {
	has := map[string]bool{}
	if !fw.Backend().NFTablesBacked() {
		all, err := fw.ChainNames(ctx, f.Tables(), "nat")
		if err != nil || all == nil {
			return nil, err
		}
		for _, c := range chains {
			has[c] = slices.Contains(all, c)
		}
		return has, nil
	}
	for _, c := range chains {
		ok, err := fw.HasChain(ctx, f.Tables(), "nat", c)
		if err != nil {
			return nil, absent(err)
		}
		has[c] = ok
	}
	return has, nil
}

// absent turns "this kernel has no nf_tables" into nothing to do.
func absent(err error) error {
	if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
		return nil
	}
	return err
}

// legacyHasPrefix reports whether legacy iptables' nat table of family f
// has a chain whose name starts with prefix (GC's cheap check).
func (n *node) legacyHasPrefix(ctx context.Context, f ruleset.IPVersion, prefix string) (bool, error) {
	all, err := n.legacy.ChainNames(ctx, f.Tables(), "nat")
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(all, func(c string) bool { return strings.HasPrefix(c, prefix) }), nil
}

// dropChains removes user chains of the nat table of family f, with every
// jump to them from the entry chains.
func dropChains(ctx context.Context, fw firewall.Interface, f ruleset.IPVersion, entries, chains []string) error {
	if len(chains) == 0 {
		return nil
	}
	for _, e := range entries {
		if _, err := firewall.DeleteMatching(ctx, fw, f.Tables(), "nat", e, func(r installed.Rule) bool {
			return slices.Contains(chains, r.Jump)
		}); err != nil {
			return err
		}
	}
	tx := &ruleset.Tx{}
	nat := ruleset.TableID{Family: f.Tables(), Name: "nat"}
	for _, c := range chains {
		tx.FlushChain(nat, c).DeleteChain(nat, c)
	}
	err := fw.Apply(ctx, tx)
	if err == nil {
		return nil
	}
	// A concurrent DEL of the same attachment removed them first?
	for _, c := range chains {
		if ch, rerr := fw.ReadChain(ctx, f.Tables(), "nat", c); rerr != nil || ch != nil {
			return fmt.Errorf("remove the reference's chains %v (%s, IPv%d): %w", chains, fw.Backend(), f, err)
		}
	}
	return nil
}

// delMasq: the reference's TeardownIPMasqForNetworks, in every form.
func (n *node) delMasq(ctx context.Context, r attachment.Reference) error {
	var errs []error
	chain := r.MasqChain()
	for _, fw := range n.iptForms() {
		for _, f := range families {
			has, err := hasChains(ctx, fw, f, chain)
			if err == nil && has[chain] {
				err = dropChains(ctx, fw, f, []string{attachment.RefMasqEntryChain}, []string{chain})
			}
			errs = append(errs, err)
		}
	}
	key := r.MasqNftKey()
	errs = append(errs, n.dropMasqNft(ctx, func(c string) bool { return strings.HasPrefix(c, key) }))
	return errors.Join(errs...)
}

// gcMasq removes the chains that POSTROUTING jumps to for an attachment
// of network not in valid (the iptables form names the container only),
// and the nftables rules as the reference's gcIPMasqNFTables does.
func (n *node) gcMasq(ctx context.Context, network string, valid []types.GCAttachment) error {
	ids := map[string]bool{}
	comments := map[string]bool{}
	for _, a := range valid {
		ids[a.ContainerID] = true
		comments[attachment.Reference{Network: network, ContainerID: a.ContainerID, IfName: a.IfName}.MasqNftComment()] = true
	}
	var errs []error
	for _, fw := range n.iptForms() {
		for _, f := range families {
			if fw == n.legacy {
				if ok, err := n.legacyHasPrefix(ctx, f, "CNI-"); err != nil || !ok {
					errs = append(errs, err)
					continue
				}
			}
			stale, err := staleJumps(ctx, fw, f, attachment.RefMasqEntryChain, func(r installed.Rule) (string, bool) {
				id, ok := idFromComment(r.Comment, "name: "+strconv.Quote(network)+" id: ", strconv.Unquote)
				return id, ok && r.Jump == attachment.Reference{Network: network, ContainerID: id}.MasqChain()
			}, ids)
			if err == nil {
				err = dropChains(ctx, fw, f, []string{attachment.RefMasqEntryChain}, stale)
			}
			errs = append(errs, err)
		}
	}
	prefix := attachment.RefMasqNftNetworkHash(network)
	errs = append(errs, n.dropMasqNft(ctx, func(c string) bool { return strings.HasPrefix(c, prefix) && !comments[c] }))
	return errors.Join(errs...)
}

// staleJumps reads entry and returns the chains it jumps to whose owner
// (what owner finds in the jump) is not in valid.
func staleJumps(ctx context.Context, fw firewall.Interface, f ruleset.IPVersion, entry string, owner func(installed.Rule) (string, bool), valid map[string]bool) ([]string, error) {
	c, err := fw.ReadChain(ctx, f.Tables(), "nat", entry)
	if err != nil || c == nil {
		return nil, absent(err)
	}
	var stale []string
	for _, r := range c.Rules {
		if id, ok := owner(r); ok && !valid[id] && !slices.Contains(stale, r.Jump) {
			stale = append(stale, r.Jump)
		}
	}
	return stale, nil
}

// idFromComment returns the container id of a comment of the form
// prefix + quoted id.
func idFromComment(comment, prefix string, unquote func(string) (string, error)) (string, bool) {
	rest, ok := strings.CutPrefix(comment, prefix)
	if !ok {
		return "", false
	}
	id, err := unquote(rest)
	return id, err == nil && id != ""
}

// plainUnquote undoes `"%s"`: the portmap comment's quoting, which escapes
// nothing.
func plainUnquote(s string) (string, error) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", fmt.Errorf("not quoted")
	}
	return s[1 : len(s)-1], nil
}

// dropMasqNft removes the rules of masq_checks whose comment sel accepts;
// when no other rule is left, the whole table goes.
func (n *node) dropMasqNft(ctx context.Context, sel func(comment string) bool) error {
	if ok, err := n.nft.HasTable(ctx, ruleset.Inet, attachment.RefMasqTable); err != nil || !ok {
		return absent(err)
	}
	return n.dropNftRules(ctx, ruleset.Inet, attachment.RefMasqTable, []string{attachment.RefMasqNftChain}, sel)
}

// dropNftRules removes the rules of the chains of a native table whose
// comment sel accepts, or the table when they were the last rules in it.
// A table it removes no rule from stays, empty or not: the reference
// plugins' own state, which meshwire removes only with the last attachment
// it takes over.
func (n *node) dropNftRules(ctx context.Context, fam ruleset.Family, table string, chains []string, sel func(string) bool) error {
	t, err := n.nft.ReadTable(ctx, fam, table)
	if err != nil || t == nil {
		return err
	}
	del := &ruleset.Tx{}
	others := 0
	for _, name := range chains {
		if c := t.Chain(name); c != nil {
			for _, r := range c.Rules {
				if sel(r.Comment) {
					del.DeleteRef(t.ID(), fwtext.Ref(r))
				} else {
					others++
				}
			}
		}
	}
	if del.Empty() {
		return nil
	}
	if others == 0 {
		return n.nft.Apply(ctx, (&ruleset.Tx{}).DestroyTable(t.ID()))
	}
	if err := n.nft.Apply(ctx, del); err == nil || !errors.Is(err, firewall.ErrNotFound) {
		return err
	}
	// Some went meanwhile: read each chain again.
	for _, name := range chains {
		if _, err := firewall.DeleteMatching(ctx, n.nft, fam, table, name, func(r installed.Rule) bool { return sel(r.Comment) }); err != nil {
			return err
		}
	}
	return nil
}

// hostportEntries are the chains that jump to the attachments' portmap
// chains.
var hostportEntries = []string{attachment.RefHostportDNAT, attachment.RefHostportSNAT}

// delPortmap: the reference's unforwardPorts of both backends.
func (n *node) delPortmap(ctx context.Context, r attachment.Reference) error {
	var errs []error
	dn, sn := r.PortmapDNATChain(), r.PortmapSNATChain()
	for _, fw := range n.iptForms() {
		for _, f := range families {
			has, err := hasChains(ctx, fw, f, dn, sn)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			var drop []string
			for _, c := range []string{dn, sn} {
				if has[c] {
					drop = append(drop, c)
				}
			}
			if len(drop) == 0 {
				continue
			}
			if err := dropChains(ctx, fw, f, hostportEntries, drop); err != nil {
				errs = append(errs, err)
				continue
			}
			_ = dropHostportBase(ctx, fw, f) // best effort
		}
	}
	comment := r.PortmapNftComment()
	for _, fam := range []ruleset.Family{ruleset.IP, ruleset.IP6} {
		errs = append(errs, n.dropHostportNft(ctx, fam, func(c string) bool { return c == comment }))
	}
	return errors.Join(errs...)
}

// gcPortmap removes the CNI-DN chains of network's attachments not in
// valid, and the shared objects left empty.
func (n *node) gcPortmap(ctx context.Context, network string, valid []types.GCAttachment) error {
	ids := map[string]bool{}
	for _, a := range valid {
		ids[a.ContainerID] = true
	}
	var errs []error
	for _, fw := range n.iptForms() {
		for _, f := range families {
			if fw == n.legacy {
				if ok, err := n.legacyHasPrefix(ctx, f, "CNI-HOSTPORT-"); err != nil || !ok {
					errs = append(errs, err)
					continue
				}
			}
			stale, err := staleJumps(ctx, fw, f, attachment.RefHostportDNAT, func(r installed.Rule) (string, bool) {
				id, ok := idFromComment(r.Comment, `dnat name: "`+network+`" id: `, plainUnquote)
				return id, ok && r.Jump == attachment.Reference{Network: network, ContainerID: id}.PortmapDNATChain()
			}, ids)
			if err == nil {
				err = dropChains(ctx, fw, f, hostportEntries, stale)
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			// The shared chains go with the last attachment this GC
			// removed, never on a GC that removed none: empty shared
			// chains another runtime's reference portmap keeps are not
			// meshwire's to remove.
			if len(stale) > 0 {
				_ = dropHostportBase(ctx, fw, f)
			}
		}
	}
	for _, fam := range []ruleset.Family{ruleset.IP, ruleset.IP6} {
		errs = append(errs, n.dropHostportNft(ctx, fam, func(string) bool { return false }))
	}
	return errors.Join(errs...)
}

// dropHostportNft removes the rules of table cni_hostport of fam whose
// comment sel accepts, or the table once nothing else is in its chains.
func (n *node) dropHostportNft(ctx context.Context, fam ruleset.Family, sel func(string) bool) error {
	if ok, err := n.nft.HasTable(ctx, fam, attachment.RefHostportTable); err != nil || !ok {
		return absent(err)
	}
	return n.dropNftRules(ctx, fam, attachment.RefHostportTable, attachment.RefHostportNftChains, sel)
}

// dropHostportBase removes the reference portmap's shared iptables chains
// of family f once they serve no attachment: CNI-HOSTPORT-DNAT and -SNAT
// hold no rule and no CNI-DN or CNI-SN chain is left.
func dropHostportBase(ctx context.Context, fw firewall.Interface, f ruleset.IPVersion) error {
	t, err := fw.ReadTable(ctx, f.Tables(), "nat")
	if err != nil || t == nil {
		return err
	}
	var base []string
	for _, c := range t.Chains {
		switch {
		case strings.HasPrefix(c.Name, "CNI-DN-"), strings.HasPrefix(c.Name, "CNI-SN-"):
			return nil
		case (c.Name == attachment.RefHostportDNAT || c.Name == attachment.RefHostportSNAT) && len(c.Rules) > 0:
			return nil
		case c.Name == attachment.RefHostportDNAT, c.Name == attachment.RefHostportSNAT,
			c.Name == attachment.RefHostportSetMark, c.Name == attachment.RefHostportMasq:
			base = append(base, c.Name)
		}
	}
	return dropChains(ctx, fw, f, []string{"PREROUTING", "OUTPUT", "POSTROUTING"}, base)
}
