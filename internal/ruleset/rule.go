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

// BuiltinHook is the netfilter hook of an iptables built-in chain
// ("prerouting" for PREROUTING), "" for any other chain.
func BuiltinHook(chain string) string {
	if IsBuiltin(chain) {
		return strings.ToLower(chain)
	}
	return ""
}
