package ruleset

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"unicode"
)

// IsBuiltin reports whether a chain is one of the kernel's built-in chains.
func IsBuiltin(chain string) bool {
	switch chain {
	case "PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING":
		return true
	}
	return false
}

// MatchKind is what a Match compares.
type MatchKind uint8

const (
	MatchIn       MatchKind = iota // input interface (Name)
	MatchOut                       // output interface (Name)
	MatchProto                     // layer 4 protocol (Name: "tcp", "udp")
	MatchSrc                       // source address (Prefix)
	MatchDst                       // destination address (Prefix)
	MatchSPort                     // source port (Name: protocol; Ports: one)
	MatchDPort                     // destination port (Name: protocol; Ports: one or a set)
	MatchMark                      // packet mark (Value)
	MatchConnMark                  // connection mark (Value)
	MatchCTState                   // conntrack state (Name: "RELATED,ESTABLISHED", "INVALID")
	MatchCTDir                     // conntrack direction (Name: "ORIGINAL", "REPLY")
	MatchUID                       // socket owner's uid (Value)
	MatchGID                       // socket owner's gid (Value)
	MatchEtherSrc                  // source MAC address (Name: "0a:58:...", bridge tables)
	MatchDstType                   // destination address type (Name: "LOCAL", "MULTICAST")
	MatchNfproto                   // address family in an inet table (Name: "ipv4", "ipv6"; nft only)
	MatchRaw                       // a user's own match text (Args), rendered verbatim: iptables arguments or nft words
)

// Match is one condition of a rule; Not negates it.
type Match struct {
	Kind   MatchKind
	Not    bool
	Name   string
	Prefix netip.Prefix
	// Host: the address is one host, which nft writes without its prefix
	// length (ip daddr 10.0.0.1); otherwise Prefix is written whole.
	Host  bool
	Ports []uint16
	Value uint32
	// Mask of MatchMark: (mark & Mask) == Value; 0 compares the whole mark.
	Mask uint32
	// Args of MatchRaw: the user's text, one argument (or nft word) each.
	Args []string
}

// TargetKind is what a rule does with a matching packet.
type TargetKind int

const (
	Jump TargetKind = iota
	Return
	Accept
	Drop
	Redirect        // REDIRECT --to-ports Port
	TProxy          // TPROXY --on-port Port --tproxy-mark Mark
	SetMark         // MARK --set-mark Mark
	ConnmarkSave    // CONNMARK --save-mark
	ConnmarkRestore // CONNMARK --restore-mark
	CTZone          // CT --zone Zone
	Masquerade      // MASQUERADE (nft: masquerade)
	DNAT            // DNAT --to-destination To (nft: dnat ip to To)
	None            // no target: a rule that only matches (a comment holder)
)

// Target is what a rule does with a matching packet.
type Target struct {
	Kind  TargetKind
	Chain string // Jump
	Port  uint16 // Redirect, TProxy
	Mark  uint32 // TProxy, SetMark
	// Mask of SetMark: the bits set (MARK --set-xmark Mark/Mask); 0 sets
	// the whole mark. A Mask equal to Mark sets those bits (nft: or).
	Mask uint32
	Zone uint16         // CTZone
	To   netip.AddrPort // DNAT (port 0: the address only)
}

// Rule is one firewall rule in a backend-neutral form: its matches in the
// order they are written (nftables keeps that order; iptables-save puts
// addresses, interfaces and the protocol first, and IPTables does too).
// Family is V4 or V6 for a rule of one address family only, 0 for both.
type Rule struct {
	Family IPVersion
	Chain  string
	Match  []Match
	Target Target
	// Comment is the rule's own comment (iptables' comment match, after
	// the other matches; nft's rule comment).
	Comment string
	// Counter puts nft's counter statement before the verdict (istio's
	// nftables rules have one); iptables counts every rule anyway.
	Counter bool
}

// Has reports whether the rule has a match of kind k.
func (r Rule) Has(k MatchKind) bool {
	return slices.ContainsFunc(r.Match, func(m Match) bool { return m.Kind == k })
}

func not(neg bool) string {
	if neg {
		return "! "
	}
	return ""
}

// IPTables renders the rule's arguments after "-A CHAIN" as iptables-save
// prints them back (comment excluded): addresses, interfaces and protocol
// first, then each match module in the rule's order, then the target.
func (r Rule) IPTables() []string {
	var head, mods []string
	proto := ""
	for _, m := range r.Match {
		if m.Kind == MatchProto {
			proto = m.Name
		}
	}
	// Addresses, then interfaces, each in the rule's order.
	for _, kinds := range [][2]MatchKind{{MatchSrc, MatchDst}, {MatchIn, MatchOut}} {
		for _, m := range r.Match {
			if m.Kind != kinds[0] && m.Kind != kinds[1] {
				continue
			}
			flag := map[MatchKind]string{MatchSrc: "-s", MatchDst: "-d", MatchIn: "-i", MatchOut: "-o"}[m.Kind]
			v := m.Name
			if m.Kind == MatchSrc || m.Kind == MatchDst {
				v = m.Prefix.String()
			}
			head = append(head, strings.Fields(not(m.Not)+flag+" "+v)...)
		}
	}
	for _, m := range r.Match {
		switch m.Kind {
		case MatchSPort, MatchDPort:
			if proto == "" {
				proto = m.Name // iptables needs -p for a port match
			}
			flag := "--sport"
			if m.Kind == MatchDPort {
				flag = "--dport"
			}
			mod := m.Name
			if len(m.Ports) > 1 {
				mod, flag = "multiport", flag+"s"
			}
			mods = append(mods, strings.Fields("-m "+mod+" "+not(m.Not)+flag+" "+joinPorts(m.Ports, ","))...)
		case MatchMark:
			v := fmt.Sprintf("0x%x", m.Value)
			if m.Mask != 0 {
				v += fmt.Sprintf("/0x%x", m.Mask)
			}
			mods = append(mods, strings.Fields(fmt.Sprintf("-m mark %s--mark %s", not(m.Not), v))...)
		case MatchConnMark:
			mods = append(mods, strings.Fields(fmt.Sprintf("-m connmark %s--mark 0x%x", not(m.Not), m.Value))...)
		case MatchCTState:
			mods = append(mods, strings.Fields("-m conntrack "+not(m.Not)+"--ctstate "+m.Name)...)
		case MatchCTDir:
			mods = append(mods, strings.Fields("-m conntrack "+not(m.Not)+"--ctdir "+m.Name)...)
		case MatchDstType:
			mods = append(mods, strings.Fields("-m addrtype "+not(m.Not)+"--dst-type "+m.Name)...)
		case MatchUID, MatchGID:
			flag := "--uid-owner"
			if m.Kind == MatchGID {
				flag = "--gid-owner"
			}
			mods = append(mods, strings.Fields(fmt.Sprintf("-m owner %s%s %d", not(m.Not), flag, m.Value))...)
		case MatchRaw:
			mods = append(mods, m.Args...)
		}
	}
	if proto != "" {
		head = append(head, "-p", proto)
	}
	if r.Comment != "" {
		mods = append(mods, "-m", "comment", "--comment", r.Comment)
	}
	return append(append(head, mods...), r.Target.iptables()...)
}

// IPTablesSpec is the rule after "-A CHAIN" as an iptables-restore line
// holds it: IPTables' arguments, quoted where they need it.
func (r Rule) IPTablesSpec() string {
	args := r.IPTables()
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

func (t Target) iptables() []string {
	switch t.Kind {
	case Jump:
		return []string{"-j", t.Chain}
	case Return:
		return []string{"-j", "RETURN"}
	case Accept:
		return []string{"-j", "ACCEPT"}
	case Drop:
		return []string{"-j", "DROP"}
	case Redirect:
		return []string{"-j", "REDIRECT", "--to-ports", fmt.Sprint(t.Port)}
	case TProxy:
		return []string{"-j", "TPROXY", "--on-port", fmt.Sprint(t.Port), "--tproxy-mark", fmt.Sprintf("0x%x/0xffffffff", t.Mark)}
	case SetMark:
		mask := t.Mask
		if mask == 0 {
			mask = 0xffffffff
		}
		return []string{"-j", "MARK", "--set-xmark", fmt.Sprintf("0x%x/0x%x", t.Mark, mask)}
	case ConnmarkSave:
		return []string{"-j", "CONNMARK", "--save-mark", "--nfmask", "0xffffffff", "--ctmask", "0xffffffff"}
	case ConnmarkRestore:
		return []string{"-j", "CONNMARK", "--restore-mark", "--nfmask", "0xffffffff", "--ctmask", "0xffffffff"}
	case CTZone:
		return []string{"-j", "CT", "--zone", fmt.Sprint(t.Zone)}
	case Masquerade:
		return []string{"-j", "MASQUERADE"}
	case DNAT:
		return []string{"-j", "DNAT", "--to-destination", addrPort(t.To)}
	case None:
		return nil
	}
	panic(fmt.Sprintf("unknown target kind %d", t.Kind))
}

// NFT renders the rule as an nft rule statement as istio-nftables writes
// it: the matches in order, a counter, the target; chainName gives the nft
// name of a jump's chain.
func (r Rule) NFT(chainName func(string) string) string {
	r.Counter = true
	return r.nft(chainName)
}

// Statement is the rule as nft writes it: the matches in order, the
// counter when Counter, the target, the comment.
func (r Rule) Statement() string {
	return r.nft(func(c string) string { return c })
}

func (r Rule) nft(chainName func(string) string) string {
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
		case MatchIn:
			a = append(a, fmt.Sprintf("iifname %s%q", op(m.Not), m.Name))
		case MatchOut:
			a = append(a, fmt.Sprintf("oifname %s%q", op(m.Not), m.Name))
		case MatchProto:
			a = append(a, "meta l4proto "+op(m.Not)+m.Name)
		case MatchSrc, MatchDst:
			ip, dir := "ip", "saddr"
			if m.Prefix.Addr().Is6() {
				ip = "ip6"
			}
			if m.Kind == MatchDst {
				dir = "daddr"
			}
			v := m.Prefix.String()
			if m.Host && m.Prefix.IsSingleIP() {
				v = m.Prefix.Addr().String()
			}
			a = append(a, fmt.Sprintf("%s %s %s%s", ip, dir, op(m.Not), v))
		case MatchSPort, MatchDPort:
			dir := "sport"
			if m.Kind == MatchDPort {
				dir = "dport"
			}
			v := joinPorts(m.Ports, ", ")
			if len(m.Ports) > 1 {
				v = "{ " + v + " }"
			}
			a = append(a, fmt.Sprintf("%s %s %s%s", m.Name, dir, op(m.Not), v))
		case MatchMark:
			if m.Mask != 0 {
				a = append(a, fmt.Sprintf("meta mark & %#08x %s %#08x", m.Mask, map[bool]string{false: "==", true: "!="}[m.Not], m.Value))
			} else {
				a = append(a, fmt.Sprintf("meta mark %s0x%x", op(m.Not), m.Value))
			}
		case MatchConnMark:
			a = append(a, fmt.Sprintf("ct mark %s0x%x", op(m.Not), m.Value))
		case MatchCTState:
			a = append(a, "ct state "+op(m.Not)+strings.ToLower(m.Name))
		case MatchCTDir:
			a = append(a, "ct direction "+op(m.Not)+strings.ToLower(m.Name))
		case MatchUID:
			a = append(a, fmt.Sprintf("meta skuid %s%d", op(m.Not), m.Value))
		case MatchGID:
			a = append(a, fmt.Sprintf("meta skgid %s%d", op(m.Not), m.Value))
		case MatchEtherSrc:
			a = append(a, "ether saddr "+op(m.Not)+m.Name)
		case MatchDstType:
			a = append(a, "fib daddr type "+op(m.Not)+strings.ToLower(m.Name))
		case MatchNfproto:
			a = append(a, "meta nfproto "+op(m.Not)+m.Name)
		case MatchRaw:
			a = append(a, strings.Join(m.Args, " "))
		}
	}
	if v := r.nftVerdict(chainName, counter); v != "" {
		a = append(a, v)
	}
	if r.Comment != "" {
		a = append(a, fmt.Sprintf("comment %q", r.Comment))
	}
	return strings.Join(a, " ")
}

// nftVerdict is the statement of the rule's target (with the counter
// before its verdict), "" for a rule without one.
func (r Rule) nftVerdict(chainName func(string) string, counter string) string {
	t := r.Target
	switch t.Kind {
	case Jump:
		return counter + "jump " + chainName(t.Chain)
	case Return:
		return counter + "return"
	case Accept:
		return counter + "accept"
	case Drop:
		return counter + "drop"
	case Redirect:
		return fmt.Sprintf("%sredirect to :%d", counter, t.Port)
	case TProxy:
		ip := "ip"
		if r.Family == V6 {
			ip = "ip6"
		}
		return fmt.Sprintf("tproxy %s to :%d meta mark set 0x%x %saccept", ip, t.Port, t.Mark, counter)
	case SetMark:
		switch t.Mask {
		case 0, 0xffffffff:
			return fmt.Sprintf("%smeta mark set 0x%x", counter, t.Mark)
		case t.Mark:
			return fmt.Sprintf("%smeta mark set meta mark or %#08x", counter, t.Mark)
		default:
			return fmt.Sprintf("%smeta mark set meta mark & %#08x ^ %#08x", counter, ^t.Mask, t.Mark)
		}
	case ConnmarkSave:
		return counter + "ct mark set meta mark"
	case ConnmarkRestore:
		return counter + "meta mark set ct mark"
	case CTZone:
		return fmt.Sprintf("%sct zone set %d", counter, t.Zone)
	case Masquerade:
		return counter + "masquerade"
	case DNAT:
		ip := "ip"
		if t.To.Addr().Is6() {
			ip = "ip6"
		}
		return fmt.Sprintf("%sdnat %s to %s", counter, ip, addrPort(t.To))
	case None:
		return strings.TrimSpace(counter)
	}
	return ""
}

// BuiltinHook is the netfilter hook of an iptables built-in chain
// ("prerouting" for PREROUTING), "" for any other chain.
func BuiltinHook(chain string) string {
	if IsBuiltin(chain) {
		return strings.ToLower(chain)
	}
	return ""
}
