package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/killpoint"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// iptables layout (nat table, one per address family):
//
//	PREROUTING  -m addrtype --dst-type LOCAL -j MESHWIRE-HOSTPORTS
//	OUTPUT      -m addrtype --dst-type LOCAL -j MESHWIRE-HOSTPORTS
//	POSTROUTING (first) -j MWHP-MASQ
//	MESHWIRE-HOSTPORTS  -j MWHP-<key>           one jump per attachment
//	MWHP-<key>          tag comment, then mark + DNAT rules of the attachment
//	MWHP-MARK-<bit>     -j MARK --set-xmark bit/bit
//	MWHP-MASQ           -m mark --mark bit/bit -j MASQUERADE  (one per bit)
//
// The jump into an attachment chain carries no match, so DEL knows it from
// the key alone: `-D MESHWIRE-HOSTPORTS -j MWHP-<key>`, `-F`, `-X` in one
// iptables-restore, whatever the runtime passes. ADD of a new attachment is
// one iptables-restore too (`-N` fails when the chain exists, which sends a
// repeated ADD to the slower path that reads the table first).
const (
	iptTop       = "MESHWIRE-HOSTPORTS"
	iptMasq      = "MWHP-MASQ"
	iptPrefix    = "MWHP-"
	iptMarkPrefx = "MWHP-MARK-"
	// iptCommentMax is the comment match's limit (255 bytes).
	iptCommentMax = 255
	iptBaseNote   = "meshwire portmap: host ports"
	iptMasqNote   = "meshwire portmap: masquerade marked connections"
)

func iptAttChain(key string) string { return iptPrefix + key }
func iptMarkChain(bit int) string   { return fmt.Sprintf("%s%d", iptMarkPrefx, bit) }

// iptNat is the nat table of family f.
func iptNat(f ruleset.IPVersion) ruleset.TableID {
	return ruleset.TableID{Family: f.Tables(), Name: "nat"}
}

// hostPrefix is ip as a one-address prefix (nft writes it bare).
func hostPrefix(ip net.IP) netip.Prefix {
	a := addrOf(ip)
	return netip.PrefixFrom(a, a.BitLen())
}

func addrOf(ip net.IP) netip.Addr {
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	a, _ := netip.AddrFromSlice(ip)
	return a
}

func prefixOf(n *net.IPNet) netip.Prefix {
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addrOf(n.IP), ones)
}

// mappingMatches are the matches of a mapping rule, in the order both
// backends write them: the host address, the marked sources, the port.
func mappingMatches(r rule) []ruleset.Match {
	var m []ruleset.Match
	if r.HostIP != nil {
		m = append(m, ruleset.Match{Kind: ruleset.MatchDst, Prefix: hostPrefix(r.HostIP), Host: true})
	}
	if r.Action == actMark && r.Src != nil {
		m = append(m, ruleset.Match{Kind: ruleset.MatchSrc, Prefix: prefixOf(r.Src)})
	}
	return append(m, ruleset.Match{Kind: ruleset.MatchDPort, Name: r.Proto, Ports: []uint16{uint16(r.HostPort)}})
}

// mappingTarget is what a mapping rule does: mark (by jumping to the
// marking chain markChain) or DNAT to the container.
func mappingTarget(r rule, markChain string) ruleset.Target {
	if r.Action == actMark {
		return ruleset.Target{Kind: ruleset.Jump, Chain: markChain}
	}
	return ruleset.Target{Kind: ruleset.DNAT, To: netip.AddrPortFrom(addrOf(r.To), uint16(r.ToPort))}
}

func jumpTo(chain, target string) ruleset.Rule {
	return ruleset.Rule{Chain: chain, Target: ruleset.Target{Kind: ruleset.Jump, Chain: target}}
}

// iptRule is one rule of an attachment chain: the mapping's matches, the
// user's conditions (conditionsV4/V6, verbatim), the target.
func iptRule(p famPlan, r rule) ruleset.Rule {
	m := mappingMatches(r)
	if len(p.Conds) > 0 {
		m = append(m, ruleset.Match{Kind: ruleset.MatchRaw, Args: p.Conds})
	}
	mark := p.ExternalMark
	if mark == "" {
		mark = iptMarkChain(p.MarkBit)
	}
	return ruleset.Rule{Family: p.Family, Chain: iptAttChain(p.Key), Match: m, Target: mappingTarget(r, mark)}
}

// iptAttachment fills the attachment chain: the tag first (a rule that
// only carries the comment), then the rules.
func iptAttachment(tx *ruleset.Tx, p famPlan) {
	nat := iptNat(p.Family)
	tx.AddRule(nat, ruleset.Rule{Chain: iptAttChain(p.Key), Comment: tag(p.Att, iptCommentMax), Target: ruleset.Target{Kind: ruleset.None}})
	for _, r := range p.Rules {
		tx.AddRule(nat, iptRule(p, r))
	}
}

// renderIPTAddNew is the one-transaction ADD of an attachment the table
// does not have yet, on a table that has the base chains. It fails as a
// whole (and changes nothing) when the attachment chain already exists or a
// base chain it refers to is missing.
func renderIPTAddNew(p famPlan) *ruleset.Tx {
	tx := (&ruleset.Tx{}).CreateChain(iptNat(p.Family), ruleset.Chain{Name: iptAttChain(p.Key)})
	iptAttachment(tx, p)
	return tx.AddRule(iptNat(p.Family), jumpTo(iptTop, iptAttChain(p.Key)))
}

// renderIPTDel removes an attachment in one transaction; it fails as a
// whole when the attachment is not (or not entirely) there.
func renderIPTDel(f ruleset.IPVersion, key string) *ruleset.Tx {
	ch, nat := iptAttChain(key), iptNat(f)
	return (&ruleset.Tx{}).DeleteRule(nat, jumpTo(iptTop, ch)).FlushChain(nat, ch).DeleteChain(nat, ch)
}

// The renderers below work from the nat table of one family as read back
// (nil: no table, or none read).

// iptTag returns the tag comment of an attachment chain.
func iptTag(st *installed.Table, key string) string {
	for _, r := range rulesOf(st, iptAttChain(key)) {
		if strings.HasPrefix(r.Comment, tagPrefix) {
			return r.Comment
		}
	}
	return ""
}

// iptDecl declares a chain: Add creates it or flushes it if present;
// Create (fresh) fails when it exists.
func iptDecl(tx *ruleset.Tx, nat ruleset.TableID, chain string, fresh bool) {
	if fresh {
		tx.CreateChain(nat, ruleset.Chain{Name: chain})
	} else {
		tx.AddChain(nat, ruleset.Chain{Name: chain})
	}
}

// renderIPTAddFresh is the one-transaction ADD on a table without any
// meshwire portmap chain (the first attachment on the node, or the first
// after the last one left): base and attachment together. Chains are
// created (-N), so it fails as a whole when any of them exists.
func renderIPTAddFresh(p famPlan) *ruleset.Tx { return iptEnsure(nil, p, true) }

// renderIPTEnsure is the slow-path ADD: it creates whatever base piece the
// table lacks, (re)fills the attachment chain and adds the jump unless it is
// there. st is the table as read under the node lock.
func renderIPTEnsure(st *installed.Table, p famPlan) *ruleset.Tx { return iptEnsure(st, p, false) }

func iptEnsure(st *installed.Table, p famPlan, fresh bool) *ruleset.Tx {
	tx := &ruleset.Tx{}
	nat := iptNat(p.Family)
	iptBase(tx, nat, st, p.MarkBit, fresh)
	ch := iptAttChain(p.Key)
	iptDecl(tx, nat, ch, fresh) // create, or flush if present
	iptAttachment(tx, p)
	if len(jumps(st, iptTop, ch)) == 0 {
		tx.AddRule(nat, jumpTo(iptTop, ch))
	}
	return tx
}

// iptBase creates the missing base chains and jumps. markBit < 0 means
// the attachment needs no marking chain.
func iptBase(tx *ruleset.Tx, nat ruleset.TableID, st *installed.Table, markBit int, fresh bool) {
	if st.Chain(iptTop) == nil {
		iptDecl(tx, nat, iptTop, fresh)
	}
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		if len(jumps(st, hook, iptTop)) == 0 {
			r := jumpTo(hook, iptTop)
			r.Match, r.Comment = []ruleset.Match{{Kind: ruleset.MatchDstType, Name: "LOCAL"}}, iptBaseNote
			tx.AddRule(nat, r)
		}
	}
	if markBit < 0 {
		return
	}
	if st.Chain(iptMasq) == nil {
		iptDecl(tx, nat, iptMasq, fresh)
	}
	if len(jumps(st, "POSTROUTING", iptMasq)) == 0 {
		r := jumpTo("POSTROUTING", iptMasq)
		r.Comment = iptMasqNote
		tx.InsertRule(nat, 0, r)
	}
	bit := uint32(1) << markBit
	mark := iptMarkChain(markBit)
	if st.Chain(mark) == nil {
		iptDecl(tx, nat, mark, fresh)
		tx.AddRule(nat, ruleset.Rule{Chain: mark, Target: ruleset.Target{Kind: ruleset.SetMark, Mark: bit, Mask: bit}})
	}
	if !slices.ContainsFunc(rulesOf(st, iptMasq), masqueradesBit(markBit)) {
		tx.AddRule(nat, ruleset.Rule{Chain: iptMasq, Match: []ruleset.Match{{Kind: ruleset.MatchMark, Value: bit, Mask: bit}},
			Target: ruleset.Target{Kind: ruleset.Masquerade}})
	}
}

// masqueradesBit: the rule of MWHP-MASQ for a mark bit
// (-m mark --mark bit/bit -j MASQUERADE).
func masqueradesBit(bit int) func(installed.Rule) bool {
	v := uint32(1) << bit
	return func(r installed.Rule) bool {
		return r.Target == "MASQUERADE" && r.HasMark && !r.NotMark && r.Mark == v && r.MarkMask == v &&
			r.Unknown == "" && !r.Src.IsValid() && !r.Dst.IsValid() && r.Proto == ""
	}
}

// iptDelete removes a rule read back, by its iptables form. A rule the
// typed fields do not wholly describe (never one of meshwire's) is left:
// the transaction then fails on the chain it leaves behind, which changes
// nothing.
func iptDelete(tx *ruleset.Tx, nat ruleset.TableID, r installed.Rule) {
	if spec, ok := fwtext.InstalledIPTablesSpec(r); ok {
		tx.DeleteRef(nat, ruleset.RuleRef{Chain: r.Chain, Spec: spec})
	}
}

// renderIPTRemove removes the given attachments (jump, rules, chain) as the
// table of family f shows them and, with teardown, the base when nothing
// else is left in it. It is empty when there is nothing to do.
func renderIPTRemove(f ruleset.IPVersion, st *installed.Table, keys []string, teardown bool) *ruleset.Tx {
	tx := &ruleset.Tx{}
	nat := iptNat(f)
	for _, k := range keys {
		ch := iptAttChain(k)
		if st != nil {
			for _, c := range st.Chains {
				for _, r := range jumpsIn(c.Rules, ch) {
					iptDelete(tx, nat, r)
				}
			}
		}
		if st.Chain(ch) != nil {
			tx.FlushChain(nat, ch).DeleteChain(nat, ch)
		}
	}
	if teardown && remaining(attachmentKeys(st, iptPrefix), keys) == 0 {
		iptTeardown(tx, nat, st)
	}
	return tx
}

// iptTeardown removes the base. Deleting a chain that still has rules or
// references fails, which aborts the whole transaction: an attachment
// added concurrently keeps the base alive.
func iptTeardown(tx *ruleset.Tx, nat ruleset.TableID, st *installed.Table) {
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		for _, r := range jumps(st, hook, iptTop) {
			iptDelete(tx, nat, r)
		}
	}
	for _, r := range jumps(st, "POSTROUTING", iptMasq) {
		iptDelete(tx, nat, r)
	}
	if st.Chain(iptTop) != nil {
		tx.DeleteChain(nat, iptTop)
	}
	for _, ch := range sortedChains(st, iptMarkPrefx) {
		tx.FlushChain(nat, ch).DeleteChain(nat, ch)
	}
	if st.Chain(iptMasq) != nil {
		tx.FlushChain(nat, iptMasq).DeleteChain(nat, iptMasq)
	}
}

// iptHasBase reports whether any base piece is present.
func iptHasBase(st *installed.Table) bool {
	return st.Chain(iptTop) != nil || st.Chain(iptMasq) != nil || len(sortedChains(st, iptMarkPrefx)) > 0
}

// The iptables driver: the layout above applied through the firewall
// front door.

type iptDriver struct{ fw firewall.Interface }

func (d *iptDriver) b() firewall.Backend { return d.fw.Backend() }

// read reads the nat table of family f.
func (d *iptDriver) read(ctx context.Context, f ruleset.IPVersion) (*installed.Table, error) {
	t, err := d.fw.ReadTable(ctx, f.Tables(), "nat")
	if err != nil {
		return nil, cnierr.Wrap(err, "read the %s nat table (IPv%d)", d.b(), f)
	}
	return t, nil
}

// chain reads one chain of the nat table of family f (nil: not there).
func (d *iptDriver) chain(ctx context.Context, f ruleset.IPVersion, name string) (*installed.Chain, error) {
	return d.fw.ReadChain(ctx, f.Tables(), "nat", name)
}

func (d *iptDriver) apply(ctx context.Context, tx *ruleset.Tx) error {
	slog.Debug("firewall transaction", "backend", d.b().String(), "operations", tx.Len())
	return d.fw.Apply(ctx, tx)
}

func (d *iptDriver) hint(f ruleset.IPVersion) baseHint {
	return baseHint(fmt.Sprintf("%s-v%d", d.b(), f))
}

func (d *iptDriver) add(ctx context.Context, a attachment.ID, plans []famPlan) error {
	for _, p := range plans {
		// A wrong hint costs one refused transaction, never a wrong rule.
		err := firstTry(d.hint(p.Family), renderIPTAddNew(p), renderIPTAddFresh(p), func(tx *ruleset.Tx) error {
			return d.apply(ctx, tx)
		})
		if err == nil {
			killpoint.Here(fmt.Sprintf("rules IPv%d", p.Family))
			continue
		}
		if isTryAgain(err) {
			return err
		}
		slog.Debug("single-transaction ADD refused; reading the table", "family", int(p.Family), "error", err)
		if err := d.ensure(ctx, p); err != nil {
			return err
		}
		killpoint.Here(fmt.Sprintf("rules IPv%d", p.Family))
	}
	return nil
}

// ensure is the slow path of ADD, under the node lock.
func (d *iptDriver) ensure(ctx context.Context, p famPlan) error {
	return locked(func() error {
		st, err := d.read(ctx, p.Family)
		if err != nil {
			return err
		}
		if err := d.apply(ctx, renderIPTEnsure(st, p)); err != nil {
			return cnierr.Wrap(err, "install the port mappings (IPv%d, %s)", p.Family, d.b())
		}
		d.hint(p.Family).set(true)
		return nil
	})
}

func (d *iptDriver) del(ctx context.Context, keys []string, fams []ruleset.IPVersion, wantUDP bool) (map[ruleset.IPVersion][]int, error) {
	udp := map[ruleset.IPVersion][]int{}
	for _, f := range fams {
		if wantUDP {
			// The attachment's chain, under the first key that has one.
			for _, k := range keys {
				if c, err := d.chain(ctx, f, iptAttChain(k)); err == nil && c != nil {
					udp[f] = udpPortsOf(c.Rules)[f]
					break
				}
			}
		}
		if gone, orphanBase := d.gone(ctx, f, keys); gone {
			if orphanBase {
				d.maybeTeardown(ctx, f)
			}
			continue
		}
		err := d.apply(ctx, renderIPTDel(f, keys[0]))
		switch {
		case err == nil:
			d.maybeTeardown(ctx, f)
		case isTryAgain(err):
			return nil, err
		default:
			// Not (entirely) there, or made under an older key: remove
			// whatever is, as the table shows it.
			if err := d.remove(ctx, f, keys); err != nil {
				return nil, err
			}
		}
	}
	return udp, nil
}

// gone tells, from the nat table's chain names alone (no tool run: one
// getsockopt on legacy iptables, one netlink dump on iptables-nft), that
// no chain of the attachment (under any of keys) is there, and whether
// the base is then left with no attachment at all (a DEL interrupted
// before its teardown). A DEL of an attachment already removed is common:
// containerd runs one at StopPodSandbox and another at RemovePodSandbox.
// Without this check it failed its transaction and fell back to reading
// the whole table; on legacy iptables that read and the restore after it
// each copy every pod's rules (measured with 250 pods on the node: 24.8
// ms of CPU for the second DEL against 12.1 with 25). On any doubt (the
// names unreadable) it says no, and DEL takes the usual path.
func (d *iptDriver) gone(ctx context.Context, f ruleset.IPVersion, keys []string) (gone, orphanBase bool) {
	names, err := d.fw.ChainNames(ctx, f.Tables(), "nat")
	if err != nil {
		return false, false
	}
	present := attachmentNames(names)
	for _, k := range keys {
		if slices.Contains(present, k) {
			return false, false
		}
	}
	base := slices.ContainsFunc(names, func(n string) bool {
		return n == iptTop || n == iptMasq || strings.HasPrefix(n, iptMarkPrefx)
	})
	return true, base && len(present) == 0
}

// attachmentNames are the keys of the attachment chains among names.
func attachmentNames(names []string) []string {
	var keys []string
	for _, n := range names {
		if k, ok := strings.CutPrefix(n, iptPrefix); ok && isKey(k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// remove deletes attachments as the table shows them (and the base when
// nothing is left), under the node lock.
func (d *iptDriver) remove(ctx context.Context, f ruleset.IPVersion, keys []string) error {
	return locked(func() error {
		// With the base: refused as a whole if an ADD (which takes no lock)
		// added an attachment since the read; then again without it.
		var err error
		for _, teardown := range []bool{true, false} {
			var st *installed.Table
			if st, err = d.read(ctx, f); err != nil {
				return err
			}
			tx := renderIPTRemove(f, st, keys, teardown)
			if tx.Empty() {
				return nil
			}
			if err = d.apply(ctx, tx); err == nil {
				if teardown && remaining(attachmentKeys(st, iptPrefix), keys) == 0 {
					d.hint(f).set(false)
				}
				return nil
			}
			if isTryAgain(err) {
				break
			}
		}
		return cnierr.Wrap(err, "remove port mappings (IPv%d, %s)", f, d.b())
	})
}

// maybeTeardown removes the base when the top chain is empty. The probe
// reads one chain; the teardown itself runs under the node lock and is
// refused by the kernel if an attachment was added meanwhile.
func (d *iptDriver) maybeTeardown(ctx context.Context, f ruleset.IPVersion) {
	// While another attachment's chain is there the teardown would keep
	// the base anyway (renderIPTRemove): the chain names tell that with no
	// tool run, where reading the top chain on legacy iptables copies the
	// whole table, every pod's rules.
	if names, err := d.fw.ChainNames(ctx, f.Tables(), "nat"); err == nil && len(attachmentNames(names)) > 0 {
		return
	}
	top, err := d.chain(ctx, f, iptTop)
	if err != nil || top == nil || len(top.Rules) > 0 {
		return
	}
	if err := d.remove(ctx, f, nil); err != nil {
		slog.Info("base chains kept", "family", int(f), "reason", err)
	}
}

func (d *iptDriver) check(ctx context.Context, a attachment.ID, plans []famPlan) error {
	for _, p := range plans {
		st, err := d.read(ctx, p.Family)
		if err != nil {
			return err
		}
		ch := iptAttChain(checkedKey(st, iptPrefix, a))
		switch {
		case st.Chain(ch) == nil:
			return cnierr.CheckFailed("IPv%d: chain %s of this attachment is missing (%s)", p.Family, ch, d.b())
		case len(jumps(st, iptTop, ch)) != 1:
			return cnierr.CheckFailed("IPv%d: %s has %d jumps to %s, want 1", p.Family, iptTop, len(jumps(st, iptTop, ch)), ch)
		case len(jumps(st, "PREROUTING", iptTop)) == 0 || len(jumps(st, "OUTPUT", iptTop)) == 0:
			return cnierr.CheckFailed("IPv%d: PREROUTING or OUTPUT does not jump to %s", p.Family, iptTop)
		case p.MarkBit >= 0 && (st.Chain(iptMarkChain(p.MarkBit)) == nil || len(jumps(st, "POSTROUTING", iptMasq)) == 0):
			return cnierr.CheckFailed("IPv%d: the masquerade chains for mark bit %d are missing", p.Family, p.MarkBit)
		}
		if got, want := mappingSigs(rulesOf(st, ch)), planSigs(p); !slices.Equal(got, want) {
			return cnierr.CheckFailed("IPv%d: port mappings in %s are %v, want %v", p.Family, ch, got, want)
		}
	}
	return nil
}

func (d *iptDriver) gc(ctx context.Context, network string, valid map[string]bool) error {
	for _, f := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
		st, err := d.read(ctx, f)
		if err != nil {
			return err
		}
		keys := attachmentKeys(st, iptPrefix)
		stale := gcStale(keys, func(k string) string { return iptTag(st, k) }, network, valid)
		if len(stale) == 0 && (len(keys) > 0 || !iptHasBase(st)) {
			continue
		}
		slog.Info("gc", "family", int(f), "stale", stale)
		if err := d.remove(ctx, f, stale); err != nil {
			return err
		}
	}
	return nil
}
