package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
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

func nftFamily(f firewall.Family) (nfproto, ipx string) {
	if f == firewall.V6 {
		return "ipv6", "ip6"
	}
	return "ipv4", "ip"
}

func nftQuote(s string) string {
	return `"` + strings.NewReplacer(`\`, ``, `"`, `'`).Replace(s) + `"`
}

// nftRuleExpr renders one rule of an attachment chain.
func nftRuleExpr(p famPlan, r rule) string {
	nfproto, ipx := nftFamily(p.Family)
	b := []string{"meta nfproto " + nfproto}
	b = append(b, p.Conds...)
	if r.HostIP != nil {
		b = append(b, ipx+" daddr "+r.HostIP.String())
	}
	if r.Action == actMark && r.Src != nil {
		b = append(b, ipx+" saddr "+r.Src.String())
	}
	b = append(b, fmt.Sprintf("%s dport %d", r.Proto, r.HostPort))
	switch r.Action {
	case actMark:
		b = append(b, "jump "+nftMarkChain(p.MarkBit))
	case actDNAT:
		b = append(b, fmt.Sprintf("dnat %s to %s", ipx, ipPort(r.To, r.ToPort)))
	}
	return strings.Join(b, " ")
}

// nftAttachmentLines fill an existing, empty attachment chain: the anchor
// reference, then the rules of each family.
func nftAttachmentLines(key string, plans []famPlan) []string {
	ch := nftAttChain(key)
	lines := []string{fmt.Sprintf("add rule %s %s jump %s", nftFQ, ch, nftAnchor)}
	for _, p := range plans {
		for _, r := range p.Rules {
			lines = append(lines, fmt.Sprintf("add rule %s %s %s", nftFQ, ch, nftRuleExpr(p, r)))
		}
	}
	return lines
}

func nftChainDecl(verb, key string, a attachment.ID) string {
	return fmt.Sprintf("%s chain %s %s { comment %s; }", verb, nftFQ, nftAttChain(key), nftQuote(tag(a, nftCommentMax)))
}

func nftScript(lines []string) string { return strings.Join(lines, "\n") + "\n" }

// renderNFTAddNew is the one-transaction ADD of an attachment the table does
// not have yet, on a table that has the base (and the mark chains the plans
// use). Both families go into the same transaction.
func renderNFTAddNew(a attachment.ID, plans []famPlan) string {
	key := a.PortmapKey()
	lines := []string{nftChainDecl("create", key, a)}
	lines = append(lines, nftAttachmentLines(key, plans)...)
	lines = append(lines, fmt.Sprintf("add rule %s %s jump %s", nftFQ, nftHostports, nftAttChain(key)))
	return nftScript(lines)
}

// renderNFTAddFresh is the one-transaction ADD on a node without the
// table: `create table` fails when it exists, which aborts the whole
// transaction.
func renderNFTAddFresh(a attachment.ID, plans []famPlan) string {
	return nftScript(nftEnsureLines(nil, a, plans, "create"))
}

// The renderers below work from the table inet meshwire_portmap as read
// back (nil: no table), or from the few chains of it a fast path read.

// nftMarkBits lists the mark bits whose mark chain is in the table.
func nftMarkBits(st *firewall.Table) []int {
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
func renderNFTEnsure(st *firewall.Table, a attachment.ID, plans []famPlan) string {
	return nftScript(nftEnsureLines(st, a, plans, "add"))
}

func nftEnsureLines(st *firewall.Table, a attachment.ID, plans []famPlan, tableVerb string) []string {
	bits := map[int]bool{}
	for _, b := range nftMarkBits(st) {
		bits[b] = true
	}
	for _, p := range plans {
		if p.MarkBit >= 0 {
			bits[p.MarkBit] = true
		}
	}
	lines := nftBaseLines(bits, tableVerb)
	key := a.PortmapKey()
	ch := nftAttChain(key)
	if st.Chain(ch) != nil {
		lines = append(lines, fmt.Sprintf("flush chain %s %s", nftFQ, ch))
	} else {
		lines = append(lines, nftChainDecl("add", key, a))
	}
	lines = append(lines, nftAttachmentLines(key, plans)...)
	if len(jumps(st, nftHostports, ch)) == 0 {
		lines = append(lines, fmt.Sprintf("add rule %s %s jump %s", nftFQ, nftHostports, ch))
	}
	return lines
}

func nftBaseLines(bits map[int]bool, tableVerb string) []string {
	lines := []string{
		fmt.Sprintf("%s table %s { comment %s; }", tableVerb, nftFQ, nftQuote("meshwire portmap: host ports of pods")),
		fmt.Sprintf("add chain %s %s", nftFQ, nftHostports),
		fmt.Sprintf("add chain %s %s { comment %s; }", nftFQ, nftAnchor, nftQuote("every attachment chain refers to this chain: it keeps the table while attachments exist")),
		fmt.Sprintf("add chain %s prerouting { type nat hook prerouting priority dstnat; policy accept; }", nftFQ),
		fmt.Sprintf("add chain %s output { type nat hook output priority -100; policy accept; }", nftFQ),
		fmt.Sprintf("add chain %s postrouting { type nat hook postrouting priority srcnat; policy accept; }", nftFQ),
		fmt.Sprintf("flush chain %s prerouting", nftFQ),
		fmt.Sprintf("add rule %s prerouting fib daddr type local jump %s", nftFQ, nftHostports),
		fmt.Sprintf("flush chain %s output", nftFQ),
		fmt.Sprintf("add rule %s output fib daddr type local jump %s", nftFQ, nftHostports),
		fmt.Sprintf("flush chain %s postrouting", nftFQ),
	}
	var sorted []int
	for b := range bits {
		sorted = append(sorted, b)
	}
	sort.Ints(sorted)
	for _, b := range sorted {
		v := fmt.Sprintf("%#08x", uint32(1)<<b)
		lines = append(lines,
			fmt.Sprintf("add rule %s postrouting meta mark & %s == %s masquerade", nftFQ, v, v),
			fmt.Sprintf("add chain %s %s", nftFQ, nftMarkChain(b)),
			fmt.Sprintf("flush chain %s %s", nftFQ, nftMarkChain(b)),
			fmt.Sprintf("add rule %s %s meta mark set meta mark or %s", nftFQ, nftMarkChain(b), v),
		)
	}
	return lines
}

// renderNFTRemove removes the given attachments as the table (or the
// chains read of it) shows them; with teardown it also removes the table,
// guarded by the anchor.
func renderNFTRemove(st *firewall.Table, keys []string, teardown bool) string {
	var lines []string
	for _, k := range keys {
		ch := nftAttChain(k)
		for _, r := range jumps(st, nftHostports, ch) {
			lines = append(lines, fmt.Sprintf("delete rule %s %s handle %d", nftFQ, nftHostports, r.Handle))
		}
		if st.Chain(ch) != nil {
			lines = append(lines, fmt.Sprintf("delete chain %s %s", nftFQ, ch))
		}
	}
	if teardown && st != nil {
		lines = append(lines, nftTeardownLines()...)
	}
	if len(lines) == 0 {
		return ""
	}
	return nftScript(lines)
}

// nftTeardownLines delete the table; deleting the anchor first fails while
// any attachment chain (one added after the listing, too) refers to it.
func nftTeardownLines() []string {
	return []string{
		fmt.Sprintf("delete chain %s %s", nftFQ, nftAnchor),
		fmt.Sprintf("delete table %s", nftFQ),
	}
}
