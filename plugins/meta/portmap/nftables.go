package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/attachment"
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
