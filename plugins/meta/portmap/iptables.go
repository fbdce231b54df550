package main

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/firewall"
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
func markValue(bit int) string      { return fmt.Sprintf("%#x/%#x", uint32(1)<<bit, uint32(1)<<bit) }

// iptQuote quotes one argument for iptables-restore.
func iptQuote(s string) string { return ruleset.QuoteArg(s) }

func iptArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = iptQuote(a)
	}
	return strings.Join(q, " ")
}

func hostCIDR(ip net.IP) string {
	if ip.To4() != nil {
		return ip.String() + "/32"
	}
	return ip.String() + "/128"
}

func ipPort(ip net.IP, port int) string {
	return net.JoinHostPort(ip.String(), strconv.Itoa(port))
}

// iptRuleSpec renders one rule of an attachment chain (without "-A CHAIN").
func iptRuleSpec(p famPlan, r rule) string {
	var b []string
	if r.HostIP != nil {
		b = append(b, "-d", hostCIDR(r.HostIP))
	}
	if r.Action == actMark && r.Src != nil {
		b = append(b, "-s", r.Src.String())
	}
	b = append(b, "-p", r.Proto, "-m", r.Proto, "--dport", strconv.Itoa(r.HostPort))
	s := strings.Join(b, " ")
	if len(p.Conds) > 0 {
		s += " " + iptArgs(p.Conds)
	}
	switch r.Action {
	case actMark:
		target := p.ExternalMark
		if target == "" {
			target = iptMarkChain(p.MarkBit)
		}
		s += " -j " + target
	case actDNAT:
		s += " -j DNAT --to-destination " + ipPort(r.To, r.ToPort)
	}
	return s
}

// iptAttachmentLines are the rules of the attachment chain, tag first.
func iptAttachmentLines(p famPlan) []string {
	ch := iptAttChain(p.Key)
	lines := []string{fmt.Sprintf("-A %s -m comment --comment %s", ch, iptQuote(tag(p.Att, iptCommentMax)))}
	for _, r := range p.Rules {
		lines = append(lines, "-A "+ch+" "+iptRuleSpec(p, r))
	}
	return lines
}

func iptPayload(lines []string) string {
	return "*nat\n" + strings.Join(lines, "\n") + "\nCOMMIT\n"
}

// renderIPTAddNew is the one-transaction ADD of an attachment the table
// does not have yet, on a table that has the base chains. It fails as a
// whole (and changes nothing) when the attachment chain already exists or a
// base chain it refers to is missing.
func renderIPTAddNew(p famPlan) string {
	lines := []string{"-N " + iptAttChain(p.Key)}
	lines = append(lines, iptAttachmentLines(p)...)
	lines = append(lines, fmt.Sprintf("-A %s -j %s", iptTop, iptAttChain(p.Key)))
	return iptPayload(lines)
}

// renderIPTDel removes an attachment in one transaction; it fails as a
// whole when the attachment is not (or not entirely) there.
func renderIPTDel(key string) string {
	ch := iptAttChain(key)
	return iptPayload([]string{"-D " + iptTop + " -j " + ch, "-F " + ch, "-X " + ch})
}

// The renderers below work from the nat table of one family as read back
// (nil: no table, or none read).

// iptTag returns the tag comment of an attachment chain.
func iptTag(st *firewall.Table, key string) string {
	for _, r := range rulesOf(st, iptAttChain(key)) {
		if strings.HasPrefix(r.Comment, tagPrefix) {
			return r.Comment
		}
	}
	return ""
}

// iptDecl declares a chain in an iptables-restore payload: ":C - [0:0]"
// creates it or flushes it if present; "-N C" (fresh) fails when it exists.
func iptDecl(chain string, fresh bool) string {
	if fresh {
		return "-N " + chain
	}
	return ":" + chain + " - [0:0]"
}

// renderIPTAddFresh is the one-transaction ADD on a table without any
// meshwire portmap chain (the first attachment on the node, or the first
// after the last one left): base and attachment together. Chains are
// created with -N, so it fails as a whole when any of them exists.
func renderIPTAddFresh(p famPlan) string { return iptPayload(iptEnsureLines(nil, p, true)) }

// renderIPTEnsure is the slow-path ADD: it creates whatever base piece the
// table lacks, (re)fills the attachment chain and adds the jump unless it is
// there. st is the table as read under the node lock.
func renderIPTEnsure(st *firewall.Table, p famPlan) string {
	return iptPayload(iptEnsureLines(st, p, false))
}

func iptEnsureLines(st *firewall.Table, p famPlan, fresh bool) []string {
	lines := iptBaseLines(st, p.MarkBit, fresh)
	ch := iptAttChain(p.Key)
	lines = append(lines, iptDecl(ch, fresh)) // create, or flush if present
	lines = append(lines, iptAttachmentLines(p)...)
	if len(jumps(st, iptTop, ch)) == 0 {
		lines = append(lines, fmt.Sprintf("-A %s -j %s", iptTop, ch))
	}
	return lines
}

// iptBaseLines creates the missing base chains and jumps. markBit < 0 means
// the attachment needs no marking chain.
func iptBaseLines(st *firewall.Table, markBit int, fresh bool) []string {
	var lines []string
	if st.Chain(iptTop) == nil {
		lines = append(lines, iptDecl(iptTop, fresh))
	}
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		if len(jumps(st, hook, iptTop)) == 0 {
			lines = append(lines, fmt.Sprintf("-A %s -m addrtype --dst-type LOCAL -m comment --comment %s -j %s", hook, iptQuote(iptBaseNote), iptTop))
		}
	}
	if markBit < 0 {
		return lines
	}
	if st.Chain(iptMasq) == nil {
		lines = append(lines, iptDecl(iptMasq, fresh))
	}
	if len(jumps(st, "POSTROUTING", iptMasq)) == 0 {
		lines = append(lines, fmt.Sprintf("-I POSTROUTING 1 -m comment --comment %s -j %s", iptQuote(iptMasqNote), iptMasq))
	}
	mark := iptMarkChain(markBit)
	if st.Chain(mark) == nil {
		lines = append(lines, iptDecl(mark, fresh), fmt.Sprintf("-A %s -j MARK --set-xmark %s", mark, markValue(markBit)))
	}
	if !slices.ContainsFunc(rulesOf(st, iptMasq), masqueradesBit(markBit)) {
		lines = append(lines, fmt.Sprintf("-A %s -m mark --mark %s -j MASQUERADE", iptMasq, markValue(markBit)))
	}
	return lines
}

// masqueradesBit: the rule of MWHP-MASQ for a mark bit
// (-m mark --mark bit/bit -j MASQUERADE).
func masqueradesBit(bit int) func(firewall.Rule) bool {
	v := uint32(1) << bit
	return func(r firewall.Rule) bool {
		return r.Target == "MASQUERADE" && r.HasMark && !r.NotMark && r.Mark == v && r.MarkMask == v &&
			r.Unknown == "" && !r.Src.IsValid() && !r.Dst.IsValid() && r.Proto == ""
	}
}

// iptDelete is the line that removes a rule read back, in an
// iptables-restore payload. A rule the typed fields do not wholly describe
// (never one of meshwire's) gets none: the transaction then fails on the
// chain it leaves behind, which changes nothing.
func iptDelete(r firewall.Rule) []string {
	spec, ok := r.IPTablesSpec()
	if !ok {
		return nil
	}
	return []string{fmt.Sprintf("-D %s %s", r.Chain, spec)}
}

// renderIPTRemove removes the given attachments (jump, rules, chain) as the
// table shows them and, with teardown, the base when nothing else is left
// in it. It returns "" when there is nothing to do.
func renderIPTRemove(st *firewall.Table, keys []string, teardown bool) string {
	var lines []string
	for _, k := range keys {
		ch := iptAttChain(k)
		if st != nil {
			for _, c := range st.Chains {
				for _, r := range jumpsIn(c.Rules, ch) {
					lines = append(lines, iptDelete(r)...)
				}
			}
		}
		if st.Chain(ch) != nil {
			lines = append(lines, "-F "+ch, "-X "+ch)
		}
	}
	if teardown && remaining(attachmentKeys(st, iptPrefix), keys) == 0 {
		lines = append(lines, iptTeardownLines(st)...)
	}
	if len(lines) == 0 {
		return ""
	}
	return iptPayload(lines)
}

// iptTeardownLines removes the base. `-X` of a chain that still has rules
// or references fails, which aborts the whole transaction: an attachment
// added concurrently keeps the base alive.
func iptTeardownLines(st *firewall.Table) []string {
	var lines []string
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		for _, r := range jumps(st, hook, iptTop) {
			lines = append(lines, iptDelete(r)...)
		}
	}
	for _, r := range jumps(st, "POSTROUTING", iptMasq) {
		lines = append(lines, iptDelete(r)...)
	}
	if st.Chain(iptTop) != nil {
		lines = append(lines, "-X "+iptTop)
	}
	for _, ch := range sortedChains(st, iptMarkPrefx) {
		lines = append(lines, "-F "+ch, "-X "+ch)
	}
	if st.Chain(iptMasq) != nil {
		lines = append(lines, "-F "+iptMasq, "-X "+iptMasq)
	}
	return lines
}

// iptHasBase reports whether any base piece is present.
func iptHasBase(st *firewall.Table) bool {
	return st.Chain(iptTop) != nil || st.Chain(iptMasq) != nil || len(sortedChains(st, iptMarkPrefx)) > 0
}
