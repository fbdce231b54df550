package fwtext

// iptables-save's text parsed back into installed values.

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

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
func ParseIPTablesRule(f ruleset.IPVersion, table, line string) (installed.Rule, error) {
	text := strings.TrimSpace(line)
	args := SplitArgs(text)
	if len(args) < 2 || args[0] != "-A" || args[1] == "" {
		return installed.Rule{}, fmt.Errorf("not an iptables rule: %q", line)
	}
	r := installed.Rule{Family: f.Tables(), Table: table, Chain: args[1]}
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

func parseIPTablesArgs(f ruleset.IPVersion, r *installed.Rule, a []string) {
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
				r.AddUnknown(x)
			}
		case "-d", "--destination":
			if p := parsePrefix(f, next(&i)); p.IsValid() {
				r.Dst, r.NotDst = p, not
			} else {
				r.AddUnknown(x)
			}
		case "-p", "--protocol", "-i", "--in-interface", "-o", "--out-interface":
			v := next(&i)
			if not {
				r.AddUnknown("!" + x) // no typed field holds the negation
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
				r.AddUnknown(match)
			}
		case "--comment":
			r.Comment = next(&i)
		case "--dport", "--destination-port":
			if p, err := strconv.ParseUint(next(&i), 10, 16); err == nil && p != 0 {
				r.DPort, r.NotDPort = uint16(p), not
			} else {
				r.AddUnknown(x) // a range, a service name
			}
		case "--sport", "--source-port":
			if p, err := strconv.ParseUint(next(&i), 10, 16); err == nil && p != 0 && !not {
				r.SPort = uint16(p)
			} else {
				r.AddUnknown(x)
			}
		case "--dst-type":
			switch t := next(&i); {
			case t == "LOCAL" && !not:
				r.DstLocal = true
			case t == "MULTICAST" && not:
				r.NotDstMulticast = true
			default:
				r.AddUnknown("addrtype")
			}
		case "--mark":
			if v, m, ok := parseMark(next(&i)); ok && match == "mark" {
				r.HasMark, r.Mark, r.MarkMask, r.NotMark = true, v, m, not
			} else if match == "mark" {
				r.AddUnknown(x)
			}
		case "-j", "--jump", "-g", "--goto":
			t := next(&i)
			switch {
			case t == "" || r.Target != "" || r.Jump != "":
				r.AddUnknown(x) // none, or a second one
			case isTargetName(t):
				r.Target = t
			default:
				r.Jump, r.Goto = t, x == "-g" || x == "--goto"
			}
		case "--to-destination":
			if r.ToDest = parseAddrPort(next(&i)); !r.ToDest.IsValid() {
				r.AddUnknown(x)
			}
		case "--to-ports", "--on-port":
			if p, err := strconv.ParseUint(strings.SplitN(next(&i), "-", 2)[0], 10, 16); err == nil {
				r.ToPort = uint16(p)
			}
		case "--tproxy-mark", "--set-xmark", "--set-mark":
			v, _, ok := parseMark(next(&i))
			r.SetMark = v
			if !ok {
				r.AddUnknown(x)
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

func parsePrefix(f ruleset.IPVersion, s string) netip.Prefix {
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
func ParseIPTablesSave(f ruleset.IPVersion, table, save string) []*installed.Table {
	var out []*installed.Table
	var cur *installed.Table
	get := func(name string) *installed.Chain {
		if c := cur.Chain(name); c != nil {
			return c
		}
		c := &installed.Chain{Family: f.Tables(), Table: cur.Name, Name: name, Hook: ruleset.BuiltinHook(name)}
		cur.Chains = append(cur.Chains, c)
		return c
	}
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "*"):
			cur = &installed.Table{Family: f.Tables(), Name: line[1:]}
			out = append(out, cur)
		case strings.HasPrefix(line, "-P ") || strings.HasPrefix(line, "-N ") || strings.HasPrefix(line, ":"):
			if cur == nil {
				cur = &installed.Table{Family: f.Tables(), Name: table}
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
				cur = &installed.Table{Family: f.Tables(), Name: table}
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
