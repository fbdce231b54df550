package firewall

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// Typed rules: what meshwire reads back from the host, whatever the
// backend. An iptables table of family V4 is the nf_tables table of
// family IP with the same name (iptables-nft keeps it there; for
// iptables-legacy the address is only a name), so every table is named by
// a TableFamily and a name.

// TableFamily is the family of an nf_tables table: ruleset's, the one
// NFPROTO type of the project.
type TableFamily = ruleset.Family

const (
	IP     = ruleset.IP
	IP6    = ruleset.IP6
	Inet   = ruleset.Inet
	Bridge = ruleset.Bridge
)

// ParseTableFamily reads an nft family keyword.
func ParseTableFamily(s string) (TableFamily, error) { return ruleset.ParseFamily(s) }

// Rule is one rule as read back: where it is, and what it matches and does,
// as typed values. The match fields' zero values mean "not matched on".
// Fields not listed here (a user's extra matches) do not break a read: their
// names are in Unknown and the typed fields describe the rest.
type Rule struct {
	Family   TableFamily // the table's family (IP or IP6 for iptables)
	Table    string
	Chain    string
	Handle   uint64 // nf_tables handle (0 when read from legacy iptables' text)
	Position int    // 1-based position in the chain (iptables' rule number)
	Comment  string // -m comment, or the nftables rule comment

	// IPFamily is the address family the rule is limited to in an inet (or
	// bridge) table (meta nfproto), or implied by its addresses; 0 is both.
	IPFamily Family
	Proto    string // "tcp", "udp", "sctp", "icmp", ... or a number
	Src, Dst netip.Prefix
	NotSrc   bool
	NotDst   bool
	SPort    uint16
	DPort    uint16
	NotDPort bool
	In, Out  string // interface names
	// Mark matches the packet mark: (mark & MarkMask) == Mark (or !=, with
	// NotMark). MarkMask is 0xffffffff for an exact match. HasMark tells a
	// match on mark 0 from no match.
	HasMark  bool
	Mark     uint32
	MarkMask uint32
	NotMark  bool
	// DstLocal: -m addrtype --dst-type LOCAL, fib daddr type local.
	DstLocal bool
	// NotDstMulticast: -m addrtype ! --dst-type MULTICAST.
	NotDstMulticast bool

	// Target is what the rule does, as iptables names it: ACCEPT, DROP,
	// RETURN, MASQUERADE, DNAT, SNAT, REDIRECT, TPROXY, MARK, CONNMARK, CT,
	// ... ("" for a jump, or no verdict at all).
	Target string
	// Jump is the user chain the rule jumps (or, with Goto, goes) to.
	Jump string
	Goto bool
	// ToDest is DNAT's --to-destination (nft: dnat to), port 0 when none.
	ToDest netip.AddrPort
	// ToPort is REDIRECT's --to-ports and TPROXY's --on-port.
	ToPort uint16
	// SetMark is MARK --set-xmark's or TPROXY --tproxy-mark's value (nft:
	// meta mark set).
	SetMark uint32

	// Spec is the rule after "-A CHAIN " as iptables-save prints it, for
	// rules read from text (legacy iptables, the Fake's iptables tables),
	// or the rule's statement for the Fake's nftables tables; "" when read
	// over netlink (see IPTablesSpec).
	Spec string
	// Unknown names the matches and statements the typed fields do not
	// hold, separated by spaces ("" when they hold the whole rule). Rule
	// stays comparable with ==.
	Unknown string
}

func (r *Rule) unknown(what string) {
	if r.Unknown != "" {
		r.Unknown += " "
	}
	r.Unknown += what
}

// Chain is a chain as read back.
type Chain struct {
	Family  TableFamily
	Table   string
	Name    string
	Comment string // nftables chain comment
	// Hook is the netfilter hook of a base chain ("prerouting", ...);
	// "" for a regular chain. iptables' built-in chains have theirs.
	Hook  string
	Rules []Rule
}

// Table is a table as read back: its chains in order, with their rules.
type Table struct {
	Family  TableFamily
	Name    string
	Comment string // nftables table comment
	Chains  []*Chain
}

// Chain returns the named chain, or nil.
func (t *Table) Chain(name string) *Chain {
	if t == nil {
		return nil
	}
	for _, c := range t.Chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Rules returns every rule of the table, chain after chain.
func (t *Table) Rules() []Rule {
	var out []Rule
	if t != nil {
		for _, c := range t.Chains {
			out = append(out, c.Rules...)
		}
	}
	return out
}

// ---- iptables text ----

// SplitArgs splits an iptables-save rule line into arguments the way
// iptables-restore does: words separated by blanks, double quotes group,
// a backslash escapes the next character inside quotes.
func SplitArgs(line string) []string {
	var out []string
	var cur strings.Builder
	in, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case c == '"':
			quoted = !quoted
			in = true
		case !quoted && (c == ' ' || c == '\t'):
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// ParseIPTablesRule reads one rule line of `iptables -S` or iptables-save
// ("-A CHAIN args...") into a Rule of the table of family f. Matches it
// does not know are listed in Unknown; it fails only on a line that is not
// a rule.
func ParseIPTablesRule(f Family, table, line string) (Rule, error) {
	text := strings.TrimSpace(line)
	args := SplitArgs(text)
	if len(args) < 2 || args[0] != "-A" || args[1] == "" {
		return Rule{}, fmt.Errorf("not an iptables rule: %q", line)
	}
	r := Rule{Family: f.Tables(), Table: table, Chain: args[1]}
	r.Spec = strings.TrimSpace(skipArg(skipArg(text)))
	parseIPTablesArgs(f, &r, args[2:])
	return r, nil
}

// skipArg returns s after its first argument, as SplitArgs reads them.
func skipArg(s string) string {
	s = strings.TrimLeft(s, " \t")
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\' && i+1 < len(s):
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && (c == ' ' || c == '\t'):
			return s[i:]
		}
	}
	return ""
}

func parseIPTablesArgs(f Family, r *Rule, a []string) {
	not := false
	next := func(i *int) string {
		if *i+1 < len(a) {
			*i++
			return a[*i]
		}
		return ""
	}
	match := ""
	for i := 0; i < len(a); i++ {
		x := a[i]
		if x == "!" {
			not = true
			continue
		}
		switch x {
		case "-s", "--source":
			if p := parsePrefix(f, next(&i)); p.IsValid() {
				r.Src, r.NotSrc = p, not
			} else {
				r.unknown(x)
			}
		case "-d", "--destination":
			if p := parsePrefix(f, next(&i)); p.IsValid() {
				r.Dst, r.NotDst = p, not
			} else {
				r.unknown(x)
			}
		case "-p", "--protocol", "-i", "--in-interface", "-o", "--out-interface":
			v := next(&i)
			if not {
				r.unknown("!" + x) // no typed field holds the negation
				break
			}
			switch x {
			case "-p", "--protocol":
				r.Proto = v
			case "-i", "--in-interface":
				r.In = v
			default:
				r.Out = v
			}
		case "-m", "--match":
			match = next(&i)
			switch match {
			case "comment", "tcp", "udp", "sctp", "addrtype", "mark":
			default:
				r.unknown(match)
			}
		case "--comment":
			r.Comment = next(&i)
		case "--dport", "--destination-port":
			if p, err := strconv.ParseUint(next(&i), 10, 16); err == nil && p != 0 {
				r.DPort, r.NotDPort = uint16(p), not
			} else {
				r.unknown(x) // a range, a service name
			}
		case "--sport", "--source-port":
			if p, err := strconv.ParseUint(next(&i), 10, 16); err == nil && p != 0 && !not {
				r.SPort = uint16(p)
			} else {
				r.unknown(x)
			}
		case "--dst-type":
			switch t := next(&i); {
			case t == "LOCAL" && !not:
				r.DstLocal = true
			case t == "MULTICAST" && not:
				r.NotDstMulticast = true
			default:
				r.unknown("addrtype")
			}
		case "--mark":
			if v, m, ok := parseMark(next(&i)); ok && match == "mark" {
				r.HasMark, r.Mark, r.MarkMask, r.NotMark = true, v, m, not
			} else if match == "mark" {
				r.unknown(x)
			}
		case "-j", "--jump", "-g", "--goto":
			t := next(&i)
			switch {
			case t == "" || r.Target != "" || r.Jump != "":
				r.unknown(x) // none, or a second one
			case isTargetName(t):
				r.Target = t
			default:
				r.Jump, r.Goto = t, x == "-g" || x == "--goto"
			}
		case "--to-destination":
			if r.ToDest = parseAddrPort(next(&i)); !r.ToDest.IsValid() {
				r.unknown(x)
			}
		case "--to-ports", "--on-port":
			if p, err := strconv.ParseUint(strings.SplitN(next(&i), "-", 2)[0], 10, 16); err == nil {
				r.ToPort = uint16(p)
			}
		case "--tproxy-mark", "--set-xmark", "--set-mark":
			v, _, ok := parseMark(next(&i))
			r.SetMark = v
			if !ok {
				r.unknown(x)
			}
		}
		not = false
	}
}

// isTargetName tells a target from a user chain: targets are upper case
// (iptables' convention, which meshwire's chain names also follow, so the
// known ones are listed).
func isTargetName(t string) bool {
	switch t {
	case "ACCEPT", "DROP", "RETURN", "REJECT", "QUEUE", "LOG", "MASQUERADE", "SNAT", "DNAT", "REDIRECT",
		"TPROXY", "MARK", "CONNMARK", "CT", "NOTRACK", "TRACE", "CHECKSUM", "TCPMSS", "NFLOG", "NETMAP":
		return true
	}
	return false
}

func parsePrefix(f Family, s string) netip.Prefix {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked()
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen())
	}
	return netip.Prefix{}
}

func parseAddrPort(s string) netip.AddrPort {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap
	}
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return netip.AddrPortFrom(a, 0)
	}
	return netip.AddrPort{}
}

// parseMark reads "0x10/0x10" or "16": value and mask (0xffffffff when
// none is given); ok is false when s is neither.
func parseMark(s string) (val, mask uint32, ok bool) {
	v, m, hasMask := strings.Cut(s, "/")
	x, err := strconv.ParseUint(v, 0, 32)
	y := uint64(0xffffffff)
	if err == nil && hasMask {
		y, err = strconv.ParseUint(m, 0, 32)
	}
	return uint32(x), uint32(y), err == nil
}

// ParseIPTablesSave reads iptables-save output (or `iptables -S` of one
// table, with table naming it) into typed tables of family f: each table's
// chains in the order declared, with their rules in order.
func ParseIPTablesSave(f Family, table, save string) []*Table {
	var out []*Table
	var cur *Table
	get := func(name string) *Chain {
		if c := cur.Chain(name); c != nil {
			return c
		}
		c := &Chain{Family: f.Tables(), Table: cur.Name, Name: name, Hook: builtinHook(name)}
		cur.Chains = append(cur.Chains, c)
		return c
	}
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "*"):
			cur = &Table{Family: f.Tables(), Name: line[1:]}
			out = append(out, cur)
		case strings.HasPrefix(line, "-P ") || strings.HasPrefix(line, "-N ") || strings.HasPrefix(line, ":"):
			if cur == nil {
				cur = &Table{Family: f.Tables(), Name: table}
				out = append(out, cur)
			}
			fields := strings.Fields(strings.TrimPrefix(line, ":"))
			if len(fields) > 0 && (fields[0] == "-P" || fields[0] == "-N") {
				fields = fields[1:]
			}
			if len(fields) > 0 {
				get(fields[0])
			}
		case strings.HasPrefix(line, "-A "):
			if cur == nil {
				cur = &Table{Family: f.Tables(), Name: table}
				out = append(out, cur)
			}
			r, err := ParseIPTablesRule(f, cur.Name, line)
			if err != nil {
				continue
			}
			c := get(r.Chain)
			r.Position = len(c.Rules) + 1
			c.Rules = append(c.Rules, r)
		}
	}
	return out
}

func builtinHook(chain string) string {
	switch chain {
	case "PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING":
		return strings.ToLower(chain)
	}
	return ""
}

// IPTablesSpec renders the rule after "-A CHAIN " as iptables-save prints
// it, for use in `-D CHAIN spec` lines: Spec when the rule was read from
// text, else from the typed fields when they hold the whole rule (ok is
// false when Unknown is not empty, or the rule is not an iptables one).
func (r Rule) IPTablesSpec() (spec string, ok bool) {
	if r.Spec != "" && (r.Family == IP || r.Family == IP6) {
		return r.Spec, true
	}
	if r.Unknown != "" || (r.Family != IP && r.Family != IP6) {
		return "", false
	}
	if r.ToPort != 0 || r.SetMark != 0 || (r.ToDest.IsValid() && r.Target != "DNAT") || (r.Jump != "" && r.Target != "") {
		return "", false // options of a target rendered below only by name
	}
	var a []string
	neg := func(n bool) {
		if n {
			a = append(a, "!")
		}
	}
	if r.Src.IsValid() {
		neg(r.NotSrc)
		a = append(a, "-s", r.Src.String())
	}
	if r.Dst.IsValid() {
		neg(r.NotDst)
		a = append(a, "-d", r.Dst.String())
	}
	if r.In != "" {
		a = append(a, "-i", ruleset.QuoteArg(r.In))
	}
	if r.Out != "" {
		a = append(a, "-o", ruleset.QuoteArg(r.Out))
	}
	if r.Proto != "" {
		a = append(a, "-p", ruleset.QuoteArg(r.Proto))
	}
	if r.SPort != 0 || r.DPort != 0 {
		if r.Proto != "tcp" && r.Proto != "udp" && r.Proto != "sctp" {
			return "", false // a port match needs the protocol's module
		}
		a = append(a, "-m", r.Proto)
		if r.SPort != 0 {
			a = append(a, "--sport", strconv.Itoa(int(r.SPort)))
		}
		if r.DPort != 0 {
			neg(r.NotDPort)
			a = append(a, "--dport", strconv.Itoa(int(r.DPort)))
		}
	}
	if r.DstLocal {
		a = append(a, "-m", "addrtype", "--dst-type", "LOCAL")
	}
	if r.NotDstMulticast {
		a = append(a, "-m", "addrtype", "!", "--dst-type", "MULTICAST")
	}
	if r.HasMark {
		a = append(a, "-m", "mark")
		neg(r.NotMark)
		if r.MarkMask == 0xffffffff {
			a = append(a, "--mark", fmt.Sprintf("%#x", r.Mark))
		} else {
			a = append(a, "--mark", fmt.Sprintf("%#x/%#x", r.Mark, r.MarkMask))
		}
	}
	if r.Comment != "" {
		a = append(a, "-m", "comment", "--comment", ruleset.QuoteArg(r.Comment))
	}
	switch {
	case r.Jump != "" && r.Goto:
		a = append(a, "-g", ruleset.QuoteArg(r.Jump))
	case r.Jump != "":
		a = append(a, "-j", ruleset.QuoteArg(r.Jump))
	case r.Target == "DNAT" && r.ToDest.Addr().IsValid():
		a = append(a, "-j", "DNAT", "--to-destination", addrPortText(r.ToDest))
	case r.Target == "MASQUERADE" || r.Target == "ACCEPT" || r.Target == "DROP" || r.Target == "RETURN":
		a = append(a, "-j", r.Target)
	case r.Target != "":
		return "", false // a target whose options the typed fields do not hold
	}
	return strings.Join(a, " "), true
}

func addrPortText(ap netip.AddrPort) string {
	if ap.Port() == 0 {
		return ap.Addr().String()
	}
	return ap.String()
}
