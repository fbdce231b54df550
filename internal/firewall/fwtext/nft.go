package fwtext

// nft text: a typed transaction, table, chain or rule rendered as the nft
// tool reads it, with one quoting rule (Quote).

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// NftScript renders tx as one nft -f script (one transaction). A table
// added with chains is written as a block ("table F N { ... }"); other
// operations are one command each ("add chain F T C { ... }", "add rule
// F T C ...", "delete rule F T C handle H"). Destroy is the declaration
// and deletion of the table ("table F N", "delete table F N": no error
// when it is not there, on every nft version); Replace is that followed
// by the block.
func NftScript(tx *ruleset.Tx) (string, error) {
	if err := tx.Err(); err != nil {
		return "", err
	}
	var b strings.Builder
	for _, o := range tx.Ops() {
		s, err := nftCommand(o)
		if err != nil {
			return "", err
		}
		b.WriteString(s)
	}
	return b.String(), nil
}

func nftCommand(o ruleset.Op) (string, error) {
	where := o.Table.String()
	switch o.Object() {
	case "set", "element":
		return nftSetCommand(o)
	case "table":
		switch o.Verb {
		case ruleset.Add, ruleset.Create:
			if o.Def != nil && len(o.Def.Chains)+len(o.Def.Sets) > 0 {
				if o.Verb == ruleset.Create {
					return "create table " + where + "\n" + NftTable(*o.Def), nil
				}
				return NftTable(*o.Def), nil
			}
			return fmt.Sprintf("%s table %s%s\n", o.Verb, where, braces(comment(o.Def))), nil
		case ruleset.Flush, ruleset.Delete:
			return fmt.Sprintf("%s table %s\n", o.Verb, where), nil
		case ruleset.Destroy:
			return fmt.Sprintf("table %s\ndelete table %s\n", where, where), nil
		case ruleset.Replace:
			if o.Def == nil {
				break
			}
			return NftReplaceTable(*o.Def), nil
		}
	case "chain":
		c := o.Chain
		switch o.Verb {
		case ruleset.Add, ruleset.Create:
			var opts []string
			if c.Base != nil {
				opts = append(opts, strings.TrimSuffix(NftBaseChain(*c.Base), ";"))
			}
			if c.Comment != "" {
				opts = append(opts, "comment "+Quote(c.Comment))
			}
			return fmt.Sprintf("%s chain %s %s%s\n", o.Verb, where, c.Name, braces(opts)), nil
		case ruleset.Flush, ruleset.Delete:
			return fmt.Sprintf("%s chain %s %s\n", o.Verb, where, c.Name), nil
		}
	case "rule":
		c := o.ChainName()
		switch {
		case o.Verb == ruleset.Add:
			return fmt.Sprintf("add rule %s %s %s\n", where, c, NftStatement(*o.Rule)), nil
		case o.Verb == ruleset.Insert && o.Index == 0:
			return fmt.Sprintf("insert rule %s %s %s\n", where, c, NftStatement(*o.Rule)), nil
		case o.Verb == ruleset.Insert:
			return fmt.Sprintf("insert rule %s %s index %d %s\n", where, c, o.Index, NftStatement(*o.Rule)), nil
		case o.Verb == ruleset.Delete && o.Ref != nil && o.Ref.Handle != 0:
			return fmt.Sprintf("delete rule %s %s handle %d\n", where, c, o.Ref.Handle), nil
		case o.Verb == ruleset.Delete:
			return "", fmt.Errorf("%s: nftables deletes a rule by its handle", o)
		}
	}
	return "", fmt.Errorf("%s: not an nft operation", o)
}

func comment(t *ruleset.Table) []string {
	if t == nil || t.Comment == "" {
		return nil
	}
	return []string{"comment " + Quote(t.Comment)}
}

// braces writes nft's inline block of a command: " { a; b; }", or
// nothing.
func braces(stmts []string) string {
	if len(stmts) == 0 {
		return ""
	}
	return " { " + strings.Join(stmts, "; ") + "; }"
}

// Quote writes an nft string: nft has no escapes, so a double quote
// becomes a single one and a backslash goes.
func Quote(s string) string {
	return `"` + strings.NewReplacer(`\`, ``, `"`, `'`).Replace(s) + `"`
}

// NftRule renders the rule as an nft rule statement as istio-nftables writes
// it: the matches in order, a counter, the target; chainName gives the nft
// name of a jump's chain.
func NftRule(r ruleset.Rule, chainName func(string) string) string {
	r.Counter = true
	return nftRule(r, chainName)
}

// NftStatement is the rule as nft writes it: the matches in order, the
// counter when Counter, the target, the comment.
func NftStatement(r ruleset.Rule) string {
	return nftRule(r, func(c string) string { return c })
}

func nftRule(r ruleset.Rule, chainName func(string) string) string {
	counter := ""
	if r.Counter {
		counter = "counter "
	}
	var a []string
	op := func(neg bool) string {
		if neg {
			return "!= "
		}
		return ""
	}
	for _, m := range r.Match {
		switch m.Kind {
		case ruleset.MatchIn:
			a = append(a, "iifname "+op(m.Not)+Quote(m.Name))
		case ruleset.MatchOut:
			a = append(a, "oifname "+op(m.Not)+Quote(m.Name))
		case ruleset.MatchProto:
			a = append(a, "meta l4proto "+op(m.Not)+m.Name)
		case ruleset.MatchSrc, ruleset.MatchDst:
			ip, dir := "ip", "saddr"
			if m.Prefix.Addr().Is6() {
				ip = "ip6"
			}
			if m.Kind == ruleset.MatchDst {
				dir = "daddr"
			}
			v := m.Prefix.String()
			if m.Host && m.Prefix.IsSingleIP() {
				v = m.Prefix.Addr().String()
			}
			a = append(a, fmt.Sprintf("%s %s %s%s", ip, dir, op(m.Not), v))
		case ruleset.MatchSPort, ruleset.MatchDPort:
			dir := "sport"
			if m.Kind == ruleset.MatchDPort {
				dir = "dport"
			}
			v := joinPorts(m.Ports, ", ")
			if len(m.Ports) > 1 {
				v = "{ " + v + " }"
			}
			a = append(a, fmt.Sprintf("%s %s %s%s", m.Name, dir, op(m.Not), v))
		case ruleset.MatchMark:
			if m.Mask != 0 {
				a = append(a, fmt.Sprintf("meta mark & %#08x %s %#08x", m.Mask, map[bool]string{false: "==", true: "!="}[m.Not], m.Value))
			} else {
				a = append(a, fmt.Sprintf("meta mark %s0x%x", op(m.Not), m.Value))
			}
		case ruleset.MatchConnMark:
			if m.Mask != 0 {
				a = append(a, fmt.Sprintf("ct mark & %#08x %s %#08x", m.Mask, map[bool]string{false: "==", true: "!="}[m.Not], m.Value))
			} else {
				a = append(a, fmt.Sprintf("ct mark %s0x%x", op(m.Not), m.Value))
			}
		case ruleset.MatchDstSet:
			a = append(a, fmt.Sprintf("%s daddr %s@%s", ipOf(r.Family), op(m.Not), m.Name))
		case ruleset.MatchCTState:
			a = append(a, "ct state "+op(m.Not)+strings.ToLower(m.Name))
		case ruleset.MatchCTDir:
			a = append(a, "ct direction "+op(m.Not)+strings.ToLower(m.Name))
		case ruleset.MatchUID:
			a = append(a, fmt.Sprintf("meta skuid %s%d", op(m.Not), m.Value))
		case ruleset.MatchGID:
			a = append(a, fmt.Sprintf("meta skgid %s%d", op(m.Not), m.Value))
		case ruleset.MatchEtherSrc:
			a = append(a, "ether saddr "+op(m.Not)+m.Name)
		case ruleset.MatchDstType:
			a = append(a, "fib daddr type "+op(m.Not)+strings.ToLower(m.Name))
		case ruleset.MatchNfproto:
			a = append(a, "meta nfproto "+op(m.Not)+m.Name)
		case ruleset.MatchRaw:
			a = append(a, strings.Join(m.Args, " "))
		}
	}
	if v := nftVerdict(r, chainName, counter); v != "" {
		a = append(a, v)
	}
	if r.Comment != "" {
		a = append(a, "comment "+Quote(r.Comment))
	}
	return strings.Join(a, " ")
}

// nftVerdict is the statement of the rule's target (with the counter
// before its verdict), "" for a rule without one.
func nftVerdict(r ruleset.Rule, chainName func(string) string, counter string) string {
	t := r.Target
	switch t.Kind {
	case ruleset.Jump:
		return counter + "jump " + chainName(t.Chain)
	case ruleset.Return:
		return counter + "return"
	case ruleset.Accept:
		return counter + "accept"
	case ruleset.Drop:
		return counter + "drop"
	case ruleset.Redirect:
		return fmt.Sprintf("%sredirect to :%d", counter, t.Port)
	case ruleset.TProxy:
		return fmt.Sprintf("tproxy %s to :%d meta mark set 0x%x %saccept", ipOf(r.Family), t.Port, t.Mark, counter)
	case ruleset.SetMark:
		switch t.SetBits() {
		case 0xffffffff:
			return fmt.Sprintf("%smeta mark set 0x%x", counter, t.Mark)
		case t.Mark:
			return fmt.Sprintf("%smeta mark set meta mark or %#08x", counter, t.Mark)
		default:
			return fmt.Sprintf("%smeta mark set meta mark & %#08x ^ %#08x", counter, ^t.Mask, t.Mark)
		}
	case ruleset.ConnmarkSave:
		return counter + "ct mark set meta mark"
	case ruleset.ConnmarkRestore:
		return counter + "meta mark set ct mark"
	case ruleset.CTZone:
		return fmt.Sprintf("%sct zone set %d", counter, t.Zone)
	case ruleset.Masquerade:
		return counter + "masquerade"
	case ruleset.DNAT:
		return fmt.Sprintf("%sdnat %s to %s", counter, ipOf(familyOf(t.To.Addr())), addrPort(t.To))
	case ruleset.SNAT:
		return fmt.Sprintf("%ssnat %s to %s", counter, ipOf(familyOf(t.To.Addr())), addrPort(t.To))
	case ruleset.ConnmarkSet:
		return fmt.Sprintf("%sct mark set ct mark & %#08x | %#08x", counter, ^t.SetBits(), t.Mark)
	case ruleset.None:
		return strings.TrimSpace(counter)
	}
	return ""
}

// ipOf is the nft keyword of an address family: ip6 for V6, else ip.
func ipOf(v ruleset.IPVersion) string {
	if v == ruleset.V6 {
		return "ip6"
	}
	return "ip"
}

// familyOf is the address family of a.
func familyOf(a netip.Addr) ruleset.IPVersion {
	if a.Is6() {
		return ruleset.V6
	}
	return ruleset.V4
}

// NftBaseChain is the chain's declaration inside braces, as nft writes it:
// "type nat hook postrouting priority srcnat; policy accept;".
func NftBaseChain(b ruleset.BaseChain) string {
	p := b.PriorityName
	if p == "" {
		p = fmt.Sprint(b.Priority)
	}
	return fmt.Sprintf("type %s hook %s priority %s; policy accept;", b.Type, b.Hook, p)
}

// NftTable renders t as an nft table block ("table F N { ... }"): its
// comment, its sets, then each chain with its hook, comment and rules.
func NftTable(t ruleset.Table) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", t.Family, t.Name)
	if t.Comment != "" {
		fmt.Fprintf(&b, "\tcomment %s\n", Quote(t.Comment))
	}
	for _, s := range t.Sets {
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n\t}\n", s.Name, s.NftType())
	}
	for _, c := range t.Chains {
		fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
		if c.Base != nil {
			fmt.Fprintf(&b, "\t\t%s\n", NftBaseChain(*c.Base))
		}
		if c.Comment != "" {
			fmt.Fprintf(&b, "\t\tcomment %s\n", Quote(c.Comment))
		}
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\t\t%s\n", NftStatement(r))
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// NftReplaceTable renders t as an nft script that replaces the table: it is
// declared (so that the delete never fails), deleted and written anew.
// It is what Tx.ReplaceTable means, as text (the golden files', and what
// the kernel tests compare the netlink encoding with).
func NftReplaceTable(t ruleset.Table) string {
	return fmt.Sprintf("add table %s %s\ndelete table %s %s\n", t.Family, t.Name, t.Family, t.Name) + NftTable(t)
}

// addrPort writes an address with its port, or alone when the port is 0.
func addrPort(ap netip.AddrPort) string {
	if ap.Port() == 0 {
		return ap.Addr().String()
	}
	return ap.String()
}

func joinPorts(ports []uint16, sep string) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, sep)
}
