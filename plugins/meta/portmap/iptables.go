package main

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
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

var iptAttChainRE = lazyRegexp(`^MWHP-[0-9a-f]{16}$`)

func iptAttChain(key string) string { return iptPrefix + key }
func iptMarkChain(bit int) string   { return fmt.Sprintf("%s%d", iptMarkPrefx, bit) }
func markValue(bit int) string      { return fmt.Sprintf("%#x/%#x", uint32(1)<<bit, uint32(1)<<bit) }

// iptQuote quotes one argument for iptables-restore.
func iptQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\"'\\") {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

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

// iptState is what iptables-save shows of the nat table.
type iptState struct {
	chains map[string]bool
	rules  map[string][]string // chain -> rule specs, as saved
}

// parseIPTSave reads `iptables-save -t nat` output.
func parseIPTSave(out string) *iptState {
	st := &iptState{chains: map[string]bool{}, rules: map[string][]string{}}
	inNat := false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "*"):
			inNat = line == "*nat"
		case !inNat:
		case strings.HasPrefix(line, ":"):
			if f := strings.Fields(line[1:]); len(f) > 0 {
				st.chains[f[0]] = true
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.SplitN(line[3:], " ", 2)
			spec := ""
			if len(f) == 2 {
				spec = f[1]
			}
			st.rules[f[0]] = append(st.rules[f[0]], spec)
		}
	}
	return st
}

// jumpsTo returns the specs of the rules of chain that jump to target.
func (st *iptState) jumpsTo(chain, target string) []string {
	var out []string
	for _, r := range st.rules[chain] {
		if strings.HasSuffix(r, "-j "+target) {
			out = append(out, r)
		}
	}
	return out
}

// attachments lists the keys of the attachment chains present.
func (st *iptState) attachments() []string {
	var keys []string
	for ch := range st.chains {
		if iptAttChainRE().MatchString(ch) {
			keys = append(keys, strings.TrimPrefix(ch, iptPrefix))
		}
	}
	sort.Strings(keys)
	return keys
}

// tag returns the tag comment of an attachment chain.
func (st *iptState) tag(key string) string {
	for _, r := range st.rules[iptAttChain(key)] {
		if c := iptComment(r); strings.HasPrefix(c, tagPrefix) {
			return c
		}
	}
	return ""
}

var iptCommentRE = lazyRegexp(`--comment ("(?:[^"\\]|\\.)*"|\S+)`)

func iptComment(spec string) string {
	m := iptCommentRE().FindStringSubmatch(spec)
	if m == nil {
		return ""
	}
	c := m[1]
	if strings.HasPrefix(c, `"`) {
		c = strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(c[1 : len(c)-1])
	}
	return c
}

// renderIPTAddFresh is the one-transaction ADD on a table without any
// meshwire portmap chain (the first attachment on the node, or the first
// after the last one left): base and attachment together. Chains are
// created with -N, so it fails as a whole when any of them exists.
func renderIPTAddFresh(p famPlan) string {
	return iptDeclRE().ReplaceAllString(renderIPTEnsure(parseIPTSave(""), p), "-N $1")
}

var iptDeclRE = lazyRegexp(`(?m)^:(\S+) - \[0:0\]$`)

// renderIPTEnsure is the slow-path ADD: it creates whatever base piece the
// table lacks, (re)fills the attachment chain and adds the jump unless it is
// there. st is the table as read under the node lock.
func renderIPTEnsure(st *iptState, p famPlan) string {
	lines := iptBaseLines(st, p.MarkBit)
	ch := iptAttChain(p.Key)
	lines = append(lines, ":"+ch+" - [0:0]") // create, or flush if present
	lines = append(lines, iptAttachmentLines(p)...)
	if len(st.jumpsTo(iptTop, ch)) == 0 {
		lines = append(lines, fmt.Sprintf("-A %s -j %s", iptTop, ch))
	}
	return iptPayload(lines)
}

// iptBaseLines creates the missing base chains and jumps. markBit < 0 means
// the attachment needs no marking chain.
func iptBaseLines(st *iptState, markBit int) []string {
	var lines []string
	if !st.chains[iptTop] {
		lines = append(lines, ":"+iptTop+" - [0:0]")
	}
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		if len(st.jumpsTo(hook, iptTop)) == 0 {
			lines = append(lines, fmt.Sprintf("-A %s -m addrtype --dst-type LOCAL -m comment --comment %s -j %s", hook, iptQuote(iptBaseNote), iptTop))
		}
	}
	if markBit < 0 {
		return lines
	}
	if !st.chains[iptMasq] {
		lines = append(lines, ":"+iptMasq+" - [0:0]")
	}
	if len(st.jumpsTo("POSTROUTING", iptMasq)) == 0 {
		lines = append(lines, fmt.Sprintf("-I POSTROUTING 1 -m comment --comment %s -j %s", iptQuote(iptMasqNote), iptMasq))
	}
	mark := iptMarkChain(markBit)
	if !st.chains[mark] {
		lines = append(lines, ":"+mark+" - [0:0]", fmt.Sprintf("-A %s -j MARK --set-xmark %s", mark, markValue(markBit)))
	}
	masq := fmt.Sprintf("-m mark --mark %s -j MASQUERADE", markValue(markBit))
	if !contains(st.rules[iptMasq], masq) {
		lines = append(lines, fmt.Sprintf("-A %s %s", iptMasq, masq))
	}
	return lines
}

// renderIPTRemove removes the given attachments (jump, rules, chain) as the
// table shows them and, with teardown, the base when nothing else is left
// in it. It returns "" when there is nothing to do.
func renderIPTRemove(st *iptState, keys []string, teardown bool) string {
	var lines []string
	for _, k := range keys {
		ch := iptAttChain(k)
		for hook := range st.rules {
			for _, r := range st.jumpsTo(hook, ch) {
				lines = append(lines, fmt.Sprintf("-D %s %s", hook, r))
			}
		}
		if st.chains[ch] {
			lines = append(lines, "-F "+ch, "-X "+ch)
		}
	}
	if teardown && remaining(st.attachments(), keys) == 0 {
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
func iptTeardownLines(st *iptState) []string {
	var lines []string
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		for _, r := range st.jumpsTo(hook, iptTop) {
			lines = append(lines, fmt.Sprintf("-D %s %s", hook, r))
		}
	}
	for _, r := range st.jumpsTo("POSTROUTING", iptMasq) {
		lines = append(lines, fmt.Sprintf("-D POSTROUTING %s", r))
	}
	if st.chains[iptTop] {
		lines = append(lines, "-X "+iptTop)
	}
	var marks []string
	for ch := range st.chains {
		if strings.HasPrefix(ch, iptMarkPrefx) {
			marks = append(marks, ch)
		}
	}
	sort.Strings(marks)
	for _, ch := range marks {
		lines = append(lines, "-F "+ch, "-X "+ch)
	}
	if st.chains[iptMasq] {
		lines = append(lines, "-F "+iptMasq, "-X "+iptMasq)
	}
	return lines
}

// iptHasBase reports whether any base piece is present.
func (st *iptState) hasBase() bool {
	if st.chains[iptTop] || st.chains[iptMasq] {
		return true
	}
	for ch := range st.chains {
		if strings.HasPrefix(ch, iptMarkPrefx) {
			return true
		}
	}
	return false
}

// dnatRE picks the parts of a saved DNAT rule CHECK compares.
var (
	iptDportRE = lazyRegexp(`-p (\w+) .*--dport (\d+)`)
	iptDstRE   = lazyRegexp(`-d (\S+)`)
	iptToRE    = lazyRegexp(`--to-destination (\S+)`)
)

// mappingSig is a comparable description of one DNAT rule: what CHECK
// compares between the plan and the table.
func mappingSig(proto string, port int, hostIP string, to string) string {
	if hostIP == "" {
		hostIP = "*"
	}
	return fmt.Sprintf("%s/%d@%s->%s", proto, port, hostIP, to)
}

func planSigs(p famPlan) []string {
	var out []string
	for _, r := range p.Rules {
		if r.Action != actDNAT {
			continue
		}
		h := ""
		if r.HostIP != nil {
			h = r.HostIP.String()
		}
		out = append(out, mappingSig(r.Proto, r.HostPort, h, ipPort(r.To, r.ToPort)))
	}
	sort.Strings(out)
	return out
}

// iptSigs reads the DNAT rules of an attachment chain back.
func iptSigs(specs []string) []string {
	var out []string
	for _, s := range specs {
		to := iptToRE().FindStringSubmatch(s)
		dp := iptDportRE().FindStringSubmatch(s)
		if to == nil || dp == nil {
			continue
		}
		port, _ := strconv.Atoi(dp[2])
		h := ""
		if d := iptDstRE().FindStringSubmatch(s); d != nil {
			h = strings.TrimSuffix(strings.TrimSuffix(d[1], "/32"), "/128")
		}
		out = append(out, mappingSig(dp[1], port, h, to[1]))
	}
	sort.Strings(out)
	return out
}

// iptUDPPorts lists the UDP host ports of an attachment chain's DNAT rules.
func iptUDPPorts(specs []string) []int {
	var out []int
	for _, s := range specs {
		dp := iptDportRE().FindStringSubmatch(s)
		if dp != nil && dp[1] == "udp" && iptToRE().MatchString(s) {
			port, _ := strconv.Atoi(dp[2])
			out = append(out, port)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
