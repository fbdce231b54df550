package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// nftables layout: one table for both families.
//
//	table inet meshwire_portmap
//	  prerouting  (nat, dstnat)  fib daddr type local jump hostports
//	  output      (nat, -100)    fib daddr type local jump hostports
//	  postrouting (nat, srcnat)  meta mark & bit == bit masquerade  (one per bit)
//	  hostports                  jump pm-<key>      one per attachment
//	  pm-<key>    comment <tag>; jump anchor; mark + DNAT rules
//	  mark-<bit>                 meta mark set meta mark | bit
//	  anchor                     empty; every pm-<key> refers to it
//
// ADD of a new attachment is one transaction (`create chain` fails when the
// chain exists, which sends a repeated ADD to the path that reads the table
// first). DEL needs the handle of the jump in hostports: one listing, one
// transaction. Teardown starts with `delete chain anchor`, which the kernel
// refuses while any attachment chain refers to it, so an attachment added
// concurrently keeps the table alive.
const (
	nftTable      = "meshwire_portmap"
	nftFQ         = "inet " + nftTable
	nftHostports  = "hostports"
	nftAnchor     = "anchor"
	nftPrefix     = "pm-"
	nftMarkPrefix = "mark-"
	// nftCommentMax is the kernel's limit on comments (128 bytes with NUL).
	nftCommentMax = 127
)

func nftAttChain(key string) string { return nftPrefix + key }
func nftMarkChain(bit int) string   { return fmt.Sprintf("%s%d", nftMarkPrefix, bit) }

// nftID is the table.
var nftID = ruleset.TableID{Family: ruleset.Inet, Name: nftTable}

// nftRule is one rule of an attachment chain: the family, the user's
// conditions (conditionsV4/V6, verbatim), the mapping's matches, the
// target.
func nftRule(p famPlan, r rule) ruleset.Rule {
	nfproto := "ipv4"
	if p.Family == ruleset.V6 {
		nfproto = "ipv6"
	}
	m := []ruleset.Match{{Kind: ruleset.MatchNfproto, Name: nfproto}}
	if len(p.Conds) > 0 {
		m = append(m, ruleset.Match{Kind: ruleset.MatchRaw, Args: p.Conds})
	}
	m = append(m, mappingMatches(r)...)
	return ruleset.Rule{Family: p.Family, Chain: nftAttChain(p.Key), Match: m, Target: mappingTarget(r, nftMarkChain(p.MarkBit))}
}

// nftAttachment fills an existing, empty attachment chain: the anchor
// reference, then the rules of each family.
func nftAttachment(tx *ruleset.Tx, key string, plans []famPlan) {
	ch := nftAttChain(key)
	tx.AddRule(nftID, jumpTo(ch, nftAnchor))
	for _, p := range plans {
		for _, r := range p.Rules {
			tx.AddRule(nftID, nftRule(p, r))
		}
	}
}

// planKey is the key the plans name the attachment by (a's current key
// when there are none).
func planKey(a attachment.ID, plans []famPlan) string {
	if len(plans) > 0 {
		return plans[0].Key
	}
	return a.PortmapKey()
}

func nftAttDecl(key string, a attachment.ID) ruleset.Chain {
	return ruleset.Chain{Name: nftAttChain(key), Comment: tag(a, nftCommentMax)}
}

// renderNFTAddNew is the one-transaction ADD of an attachment the table does
// not have yet, on a table that has the base (and the mark chains the plans
// use). Both families go into the same transaction.
func renderNFTAddNew(a attachment.ID, plans []famPlan) *ruleset.Tx {
	key := planKey(a, plans)
	tx := (&ruleset.Tx{}).CreateChain(nftID, nftAttDecl(key, a))
	nftAttachment(tx, key, plans)
	return tx.AddRule(nftID, jumpTo(nftHostports, nftAttChain(key)))
}

// renderNFTAddFresh is the one-transaction ADD on a node without the
// table: creating the table fails when it exists, which aborts the whole
// transaction.
func renderNFTAddFresh(a attachment.ID, plans []famPlan) *ruleset.Tx {
	return nftEnsure(nil, a, plans, true)
}

// The renderers below work from the table inet meshwire_portmap as read
// back (nil: no table), or from the few chains of it a fast path read.

// nftMarkBits lists the mark bits whose mark chain is in the table.
func nftMarkBits(st *installed.Table) []int {
	var bits []int
	for _, name := range sortedChains(st, nftMarkPrefix) {
		if b, err := strconv.Atoi(strings.TrimPrefix(name, nftMarkPrefix)); err == nil {
			bits = append(bits, b)
		}
	}
	sort.Ints(bits)
	return bits
}

// renderNFTEnsure is the slow-path ADD: the base is (re)declared (adding a
// table or chain that exists is a no-op; the hook chains are flushed and
// refilled, so they never hold duplicates), the attachment chain is created
// or flushed and filled, and the jump is added unless present.
func renderNFTEnsure(st *installed.Table, a attachment.ID, plans []famPlan) *ruleset.Tx {
	return nftEnsure(st, a, plans, false)
}

func nftEnsure(st *installed.Table, a attachment.ID, plans []famPlan, fresh bool) *ruleset.Tx {
	bits := map[int]bool{}
	for _, b := range nftMarkBits(st) {
		bits[b] = true
	}
	for _, p := range plans {
		if p.MarkBit >= 0 {
			bits[p.MarkBit] = true
		}
	}
	tx := nftBase(bits, fresh)
	key := planKey(a, plans)
	ch := nftAttChain(key)
	if st.Chain(ch) != nil {
		tx.FlushChain(nftID, ch)
	} else {
		tx.AddChain(nftID, nftAttDecl(key, a))
	}
	nftAttachment(tx, key, plans)
	if len(jumps(st, nftHostports, ch)) == 0 {
		tx.AddRule(nftID, jumpTo(nftHostports, ch))
	}
	return tx
}

// nftBase declares the table and its base chains (created, with fresh)
// and refills the hook chains and the mark chains of bits.
func nftBase(bits map[int]bool, fresh bool) *ruleset.Tx {
	tx := &ruleset.Tx{}
	table := ruleset.Table{Family: ruleset.Inet, Name: nftTable, Comment: "meshwire portmap: host ports of pods"}
	if fresh {
		tx.CreateTable(table)
	} else {
		tx.AddTable(table)
	}
	nat := func(hook string, prio int, name string) *ruleset.BaseChain {
		return &ruleset.BaseChain{Type: "nat", Hook: hook, Priority: prio, PriorityName: name}
	}
	local := []ruleset.Match{{Kind: ruleset.MatchDstType, Name: "LOCAL"}}
	tx.AddChain(nftID, ruleset.Chain{Name: nftHostports}).
		AddChain(nftID, ruleset.Chain{Name: nftAnchor, Comment: "every attachment chain refers to this chain: it keeps the table while attachments exist"}).
		AddChain(nftID, ruleset.Chain{Name: "prerouting", Base: nat("prerouting", -100, "dstnat")}).
		AddChain(nftID, ruleset.Chain{Name: "output", Base: nat("output", -100, "")}).
		AddChain(nftID, ruleset.Chain{Name: "postrouting", Base: nat("postrouting", 100, "srcnat")})
	for _, hook := range []string{"prerouting", "output"} {
		r := jumpTo(hook, nftHostports)
		r.Match = local
		tx.FlushChain(nftID, hook).AddRule(nftID, r)
	}
	tx.FlushChain(nftID, "postrouting")
	var sorted []int
	for b := range bits {
		sorted = append(sorted, b)
	}
	sort.Ints(sorted)
	for _, b := range sorted {
		v := uint32(1) << b
		mark := nftMarkChain(b)
		tx.AddRule(nftID, ruleset.Rule{Chain: "postrouting", Match: []ruleset.Match{{Kind: ruleset.MatchMark, Value: v, Mask: v}},
			Target: ruleset.Target{Kind: ruleset.Masquerade}})
		tx.AddChain(nftID, ruleset.Chain{Name: mark}).FlushChain(nftID, mark).
			AddRule(nftID, ruleset.Rule{Chain: mark, Target: ruleset.Target{Kind: ruleset.SetMark, Mark: v, Mask: v}})
	}
	return tx
}

// renderNFTRemove removes the given attachments as the table (or the
// chains read of it) shows them; with teardown it also removes the table,
// guarded by the anchor.
func renderNFTRemove(st *installed.Table, keys []string, teardown bool) *ruleset.Tx {
	tx := &ruleset.Tx{}
	for _, k := range keys {
		ch := nftAttChain(k)
		for _, r := range jumps(st, nftHostports, ch) {
			tx.DeleteRef(nftID, ruleset.RuleRef{Chain: nftHostports, Handle: r.Handle})
		}
		if st.Chain(ch) != nil {
			tx.DeleteChain(nftID, ch)
		}
	}
	if teardown && st != nil {
		tx.Append(nftTeardown())
	}
	return tx
}

// nftTeardown deletes the table; deleting the anchor first fails while
// any attachment chain (one added after the listing, too) refers to it.
func nftTeardown() *ruleset.Tx {
	return (&ruleset.Tx{}).DeleteChain(nftID, nftAnchor).DeleteTable(nftID)
}

// The nftables driver: the layout above applied through the firewall
// front door.

type nftDriver struct{ fw firewall.Interface }

const nftHint = baseHint("nftables")

func (d *nftDriver) apply(ctx context.Context, tx *ruleset.Tx) error {
	slog.Debug("firewall transaction", "backend", "nftables", "operations", tx.Len())
	return d.fw.Apply(ctx, tx)
}

// read reads the table (nil: not there).
func (d *nftDriver) read(ctx context.Context) (*installed.Table, error) {
	t, err := d.fw.ReadTable(ctx, ruleset.Inet, nftTable)
	if err != nil {
		return nil, cnierr.Wrap(err, "read nftables table %s", nftFQ)
	}
	return t, nil
}

// chain reads one chain of the table (nil: no table or no chain).
func (d *nftDriver) chain(ctx context.Context, name string) (*installed.Chain, error) {
	c, err := d.fw.ReadChain(ctx, ruleset.Inet, nftTable, name)
	if err != nil {
		return nil, cnierr.Wrap(err, "read nftables chain %s %s", nftFQ, name)
	}
	return c, nil
}

func (d *nftDriver) add(ctx context.Context, a attachment.ID, plans []famPlan) error {
	if len(plans) == 0 {
		return nil
	}
	err := firstTry(nftHint, renderNFTAddNew(a, plans), renderNFTAddFresh(a, plans), func(tx *ruleset.Tx) error {
		return d.apply(ctx, tx)
	})
	if err == nil || isTryAgain(err) {
		return err
	}
	slog.Debug("single-transaction ADD refused; reading the table", "error", err)
	return locked(func() error {
		st, err := d.read(ctx)
		if err != nil {
			return err
		}
		if err := d.apply(ctx, renderNFTEnsure(st, a, plans)); err != nil {
			return cnierr.Wrap(err, "install the port mappings (nftables)")
		}
		nftHint.set(true)
		return nil
	})
}

func (d *nftDriver) del(ctx context.Context, keys []string, _ []ruleset.IPVersion, wantUDP bool) (map[ruleset.IPVersion][]int, error) {
	udp := map[ruleset.IPVersion][]int{}
	hp, err := d.chain(ctx, nftHostports)
	if err != nil || hp == nil {
		return udp, err // no table: nothing of anyone's is left
	}
	chains := []*installed.Chain{hp}
	var present []string
	mine := 0
	for _, k := range keys {
		ch := nftAttChain(k)
		n := len(jumpsIn(hp.Rules, ch))
		if n == 0 {
			continue
		}
		present, mine = append(present, k), mine+n
		// The jump exists, so the chain does (the kernel refuses jumps to
		// missing chains); it is read only for its UDP ports.
		c := &installed.Chain{Name: ch}
		if wantUDP {
			if read, err := d.chain(ctx, ch); err == nil && read != nil {
				c = read
				mergePorts(udp, udpPortsOf(c.Rules))
			}
		}
		chains = append(chains, c)
	}
	if len(present) == 0 {
		return udp, nil // this attachment is not in the table (already deleted)
	}
	teardown := len(hp.Rules) == mine
	err = d.apply(ctx, renderNFTRemove(tableOf(nftTable, chains...), present, teardown))
	switch {
	case err == nil && teardown:
		d.forget()
		return udp, nil
	case err == nil:
		// Others were listed; they may have gone meanwhile (concurrent
		// DELs each see the others), so try the teardown the anchor guards.
		d.tryTeardown(ctx)
		return udp, nil
	case isTryAgain(err):
		return nil, err
	}
	// A concurrent change (or a teardown the anchor refused): redo under
	// the lock from a full read.
	return udp, d.remove(ctx, keys)
}

// tryTeardown deletes the table if no attachment chain is left: one
// transaction that the kernel refuses while any refers to the anchor.
func (d *nftDriver) tryTeardown(ctx context.Context) {
	_ = locked(func() error {
		if err := d.apply(ctx, nftTeardown()); err != nil {
			slog.Debug("table kept", "reason", err)
			return nil
		}
		d.forget()
		return nil
	})
}

// forget drops the hint once the table is gone.
func (d *nftDriver) forget() { nftHint.set(false) }

func (d *nftDriver) remove(ctx context.Context, keys []string) error {
	return locked(func() error {
		var err error
		for _, teardown := range []bool{true, false} {
			var st *installed.Table
			if st, err = d.read(ctx); err != nil {
				return err
			}
			var present []string
			for _, k := range keys {
				if st.Chain(nftAttChain(k)) != nil || len(jumps(st, nftHostports, nftAttChain(k))) > 0 {
					present = append(present, k)
				}
			}
			teardown = teardown && remaining(attachmentKeys(st, nftPrefix), present) == 0
			tx := renderNFTRemove(st, present, teardown)
			if tx.Empty() {
				return nil
			}
			if err = d.apply(ctx, tx); err == nil {
				if teardown {
					d.forget()
				}
				return nil
			}
			if isTryAgain(err) {
				break
			}
		}
		return cnierr.Wrap(err, "remove port mappings (nftables)")
	})
}

func (d *nftDriver) check(ctx context.Context, a attachment.ID, plans []famPlan) error {
	if len(plans) == 0 {
		return nil
	}
	st, err := d.read(ctx)
	if err != nil {
		return err
	}
	ch := nftAttChain(checkedKey(st, nftPrefix, a))
	c := st.Chain(ch)
	switch {
	case c == nil:
		return cnierr.CheckFailed("nftables chain %s of this attachment is missing", ch)
	case len(jumps(st, nftHostports, ch)) != 1:
		return cnierr.CheckFailed("nftables chain %s has %d jumps to %s, want 1", nftHostports, len(jumps(st, nftHostports, ch)), ch)
	case len(jumps(st, "prerouting", nftHostports)) == 0 || len(jumps(st, "output", nftHostports)) == 0:
		return cnierr.CheckFailed("nftables prerouting or output does not jump to %s", nftHostports)
	}
	var want []string
	for _, p := range plans {
		want = append(want, planSigs(p)...)
	}
	sort.Strings(want)
	if got := mappingSigs(c.Rules); !slices.Equal(got, want) {
		return cnierr.CheckFailed("port mappings in nftables chain %s are %v, want %v", ch, got, want)
	}
	return nil
}

func (d *nftDriver) gc(ctx context.Context, network string, valid map[string]bool) error {
	st, err := d.read(ctx)
	if err != nil || st == nil {
		return err
	}
	tagOf := func(k string) string {
		if c := st.Chain(nftAttChain(k)); c != nil {
			return c.Comment
		}
		return ""
	}
	keys := attachmentKeys(st, nftPrefix)
	stale := gcStale(keys, tagOf, network, valid)
	if len(stale) == 0 && len(keys) > 0 {
		return nil
	}
	slog.Info("gc", "stale", stale)
	return d.remove(ctx, stale)
}
