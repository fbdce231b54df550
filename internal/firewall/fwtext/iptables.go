package fwtext

// iptables text: typed rules rendered as iptables-restore reads them
// (iptables_parse.go reads iptables-save's back).

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// IPTablesFamily is the address family of an iptables transaction: that
// of its tables, which must all be iptables tables of one family (IP or
// IP6).
func IPTablesFamily(tx *ruleset.Tx) (ruleset.IPVersion, error) {
	var v ruleset.IPVersion
	for _, o := range tx.Ops() {
		w := ruleset.V4
		switch o.Table.Family {
		case ruleset.IP:
		case ruleset.IP6:
			w = ruleset.V6
		default:
			return 0, fmt.Errorf("%s: not an iptables table", o)
		}
		if v != 0 && v != w {
			return 0, fmt.Errorf("%s: an iptables transaction is of one address family (one iptables-restore)", o)
		}
		v = w
	}
	return v, nil
}

// IPTablesRestore renders tx as one iptables-restore --noflush payload:
// each run of operations on one table is a "*table ... COMMIT" block.
// Chains are declared (Add: ":C - [0:0]", which also empties one that is
// there), created (-N), flushed (-F) and deleted (-X); rules appended
// (-A), inserted (-I) and deleted (-D: by their iptables form, a rule
// read back by its Spec or else its position). Tables are neither added
// nor deleted in iptables.
func IPTablesRestore(tx *ruleset.Tx) (string, error) {
	if err := tx.Err(); err != nil {
		return "", err
	}
	if _, err := IPTablesFamily(tx); err != nil {
		return "", err
	}
	var b strings.Builder
	table := ""
	for _, o := range tx.Ops() {
		line, err := iptablesLine(o)
		if err != nil {
			return "", err
		}
		if o.Table.Name != table {
			if table != "" {
				b.WriteString("COMMIT\n")
			}
			table = o.Table.Name
			fmt.Fprintf(&b, "*%s\n", table)
		}
		b.WriteString(line + "\n")
	}
	if table != "" {
		b.WriteString("COMMIT\n")
	}
	return b.String(), nil
}

func iptablesLine(o ruleset.Op) (string, error) {
	switch o.Object() {
	case "chain":
		c := o.Chain.Name
		switch o.Verb {
		case ruleset.Add:
			return ":" + c + " - [0:0]", nil
		case ruleset.Create:
			return "-N " + c, nil
		case ruleset.Flush:
			return "-F " + c, nil
		case ruleset.Delete:
			return "-X " + c, nil
		}
	case "rule":
		c := o.ChainName()
		switch {
		case o.Verb == ruleset.Add:
			return "-A " + c + " " + IPTablesSpec(*o.Rule), nil
		case o.Verb == ruleset.Insert:
			return fmt.Sprintf("-I %s %d %s", c, o.Index+1, IPTablesSpec(*o.Rule)), nil
		case o.Verb == ruleset.Delete && o.Rule != nil:
			return "-D " + c + " " + IPTablesSpec(*o.Rule), nil
		case o.Verb == ruleset.Delete && o.Ref.Spec != "":
			return "-D " + c + " " + o.Ref.Spec, nil
		case o.Verb == ruleset.Delete && o.Ref.Position > 0:
			return fmt.Sprintf("-D %s %d", c, o.Ref.Position), nil
		case o.Verb == ruleset.Delete:
			return "", fmt.Errorf("%s: a rule read back with neither its iptables form nor its position", o)
		}
	}
	return "", fmt.Errorf("%s: not an iptables-restore operation", o)
}

func not(neg bool) string {
	if neg {
		return "! "
	}
	return ""
}

// IPTablesArgs renders the rule's arguments after "-A CHAIN" as iptables-save
// prints them back (comment excluded): addresses, interfaces and protocol
// first, then each match module in the rule's order, then the target.
func IPTablesArgs(r ruleset.Rule) []string {
	var head, mods []string
	proto := ""
	for _, m := range r.Match {
		if m.Kind == ruleset.MatchProto {
			proto = m.Name
		}
	}
	// Addresses, then interfaces, each in the rule's order.
	for _, kinds := range [][2]ruleset.MatchKind{{ruleset.MatchSrc, ruleset.MatchDst}, {ruleset.MatchIn, ruleset.MatchOut}} {
		for _, m := range r.Match {
			if m.Kind != kinds[0] && m.Kind != kinds[1] {
				continue
			}
			flag := map[ruleset.MatchKind]string{ruleset.MatchSrc: "-s", ruleset.MatchDst: "-d", ruleset.MatchIn: "-i", ruleset.MatchOut: "-o"}[m.Kind]
			v := m.Name
			if m.Kind == ruleset.MatchSrc || m.Kind == ruleset.MatchDst {
				v = m.Prefix.String()
			}
			head = append(head, strings.Fields(not(m.Not)+flag+" "+v)...)
		}
	}
	for _, m := range r.Match {
		switch m.Kind {
		case ruleset.MatchSPort, ruleset.MatchDPort:
			if proto == "" {
				proto = m.Name // iptables needs -p for a port match
			}
			flag := "--sport"
			if m.Kind == ruleset.MatchDPort {
				flag = "--dport"
			}
			mod := m.Name
			if len(m.Ports) > 1 {
				mod, flag = "multiport", flag+"s"
			}
			mods = append(mods, strings.Fields("-m "+mod+" "+not(m.Not)+flag+" "+joinPorts(m.Ports, ","))...)
		case ruleset.MatchMark:
			v := fmt.Sprintf("0x%x", m.Value)
			if m.Mask != 0 {
				v += fmt.Sprintf("/0x%x", m.Mask)
			}
			mods = append(mods, strings.Fields(fmt.Sprintf("-m mark %s--mark %s", not(m.Not), v))...)
		case ruleset.MatchConnMark:
			v := fmt.Sprintf("0x%x", m.Value)
			if m.Mask != 0 {
				v += fmt.Sprintf("/0x%x", m.Mask)
			}
			mods = append(mods, strings.Fields(fmt.Sprintf("-m connmark %s--mark %s", not(m.Not), v))...)
		case ruleset.MatchProtoModule:
			mods = append(mods, "-m", m.Name)
		case ruleset.MatchSocketExists:
			mods = append(mods, strings.Fields("-m owner "+not(m.Not)+"--socket-exists")...)
		case ruleset.MatchDstSet:
			mods = append(mods, strings.Fields("-m set "+not(m.Not)+"--match-set "+m.Name+" dst")...)
		case ruleset.MatchCTState:
			mods = append(mods, strings.Fields("-m conntrack "+not(m.Not)+"--ctstate "+m.Name)...)
		case ruleset.MatchCTDir:
			mods = append(mods, strings.Fields("-m conntrack "+not(m.Not)+"--ctdir "+m.Name)...)
		case ruleset.MatchDstType:
			mods = append(mods, strings.Fields("-m addrtype "+not(m.Not)+"--dst-type "+m.Name)...)
		case ruleset.MatchUID, ruleset.MatchGID:
			flag := "--uid-owner"
			if m.Kind == ruleset.MatchGID {
				flag = "--gid-owner"
			}
			mods = append(mods, strings.Fields(fmt.Sprintf("-m owner %s%s %d", not(m.Not), flag, m.Value))...)
		case ruleset.MatchRaw:
			mods = append(mods, m.Args...)
		}
	}
	if proto != "" {
		head = append(head, "-p", proto)
	}
	if r.Comment != "" {
		mods = append(mods, "-m", "comment", "--comment", r.Comment)
	}
	return append(append(head, mods...), targetArgs(r.Target)...)
}

// IPTablesSpec is the rule after "-A CHAIN" as an iptables-restore line
// holds it: IPTablesArgs, quoted where they need it.
func IPTablesSpec(r ruleset.Rule) string {
	args := IPTablesArgs(r)
	for i, a := range args {
		args[i] = QuoteArg(a)
	}
	return strings.Join(args, " ")
}

// QuoteArg quotes one argument for iptables-restore when it needs it.
func QuoteArg(s string) string {
	if s != "" && !strings.ContainsAny(s, "\"'\\") && !strings.ContainsFunc(s, unicode.IsSpace) {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// targetArgs are the target's arguments ("-j ...").
func targetArgs(t ruleset.Target) []string {
	switch t.Kind {
	case ruleset.Jump:
		return []string{"-j", t.Chain}
	case ruleset.Return:
		return []string{"-j", "RETURN"}
	case ruleset.Accept:
		return []string{"-j", "ACCEPT"}
	case ruleset.Drop:
		return []string{"-j", "DROP"}
	case ruleset.Redirect:
		return []string{"-j", "REDIRECT", "--to-ports", fmt.Sprint(t.Port)}
	case ruleset.TProxy:
		return []string{"-j", "TPROXY", "--on-port", fmt.Sprint(t.Port), "--tproxy-mark", fmt.Sprintf("0x%x/0xffffffff", t.Mark)}
	case ruleset.SetMark:
		return []string{"-j", "MARK", "--set-xmark", fmt.Sprintf("0x%x/0x%x", t.Mark, t.SetBits())}
	case ruleset.ConnmarkSave:
		return []string{"-j", "CONNMARK", "--save-mark", "--nfmask", "0xffffffff", "--ctmask", "0xffffffff"}
	case ruleset.ConnmarkRestore:
		return []string{"-j", "CONNMARK", "--restore-mark", "--nfmask", "0xffffffff", "--ctmask", "0xffffffff"}
	case ruleset.CTZone:
		return []string{"-j", "CT", "--zone", fmt.Sprint(t.Zone)}
	case ruleset.Masquerade:
		return []string{"-j", "MASQUERADE"}
	case ruleset.DNAT:
		return []string{"-j", "DNAT", "--to-destination", addrPort(t.To)}
	case ruleset.SNAT:
		return []string{"-j", "SNAT", "--to-source", addrPort(t.To)}
	case ruleset.ConnmarkSet:
		return []string{"-j", "CONNMARK", "--set-xmark", fmt.Sprintf("0x%x/0x%x", t.Mark, t.SetBits())}
	case ruleset.None:
		return nil
	}
	panic(fmt.Sprintf("unknown target kind %d", t.Kind))
}

// InstalledIPTablesSpec renders the rule after "-A CHAIN " as iptables-save prints
// it, for use in `-D CHAIN spec` lines: Spec when the rule was read from
// text, else from the typed fields when they hold the whole rule (ok is
// false when Unknown is not empty, or the rule is not an iptables one).
func InstalledIPTablesSpec(r installed.Rule) (spec string, ok bool) {
	if r.Spec != "" && (r.Family == ruleset.IP || r.Family == ruleset.IP6) {
		return r.Spec, true
	}
	if r.Unknown != "" || (r.Family != ruleset.IP && r.Family != ruleset.IP6) {
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
		a = append(a, "-i", QuoteArg(r.In))
	}
	if r.Out != "" {
		a = append(a, "-o", QuoteArg(r.Out))
	}
	if r.Proto != "" {
		a = append(a, "-p", QuoteArg(r.Proto))
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
		a = append(a, "-m", "comment", "--comment", QuoteArg(r.Comment))
	}
	switch {
	case r.Jump != "" && r.Goto:
		a = append(a, "-g", QuoteArg(r.Jump))
	case r.Jump != "":
		a = append(a, "-j", QuoteArg(r.Jump))
	case r.Target == "DNAT" && r.ToDest.Addr().IsValid():
		a = append(a, "-j", "DNAT", "--to-destination", addrPort(r.ToDest))
	case r.Target == "MASQUERADE" || r.Target == "ACCEPT" || r.Target == "DROP" || r.Target == "RETURN":
		a = append(a, "-j", r.Target)
	case r.Target != "":
		return "", false // a target whose options the typed fields do not hold
	}
	return strings.Join(a, " "), true
}

// Ref names the rule r for its deletion (ruleset.Tx.DeleteRef): by handle
// when it was read from nf_tables, else by its iptables form (Spec, or
// one rendered from the typed fields when they hold the whole rule), else
// by position.
func Ref(r installed.Rule) ruleset.RuleRef {
	ref := ruleset.RuleRef{Chain: r.Chain, Handle: r.Handle, Position: r.Position}
	if spec, ok := InstalledIPTablesSpec(r); ok {
		ref.Spec = spec
	}
	return ref
}
