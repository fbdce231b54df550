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
)

// Match is one condition of a rule; Not negates it.
type Match struct {
	Kind   MatchKind
	Not    bool
	Name   string
	Prefix netip.Prefix
	Ports  []uint16
	Value  uint32
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
)

// Target is what a rule does with a matching packet.
type Target struct {
	Kind  TargetKind
	Chain string // Jump
	Port  uint16 // Redirect, TProxy
	Mark  uint32 // TProxy, SetMark
	Zone  uint16 // CTZone
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
	for _, k := range []MatchKind{MatchSrc, MatchDst, MatchIn, MatchOut} {
		for _, m := range r.Match {
			if m.Kind != k {
				continue
			}
			flag := map[MatchKind]string{MatchSrc: "-s", MatchDst: "-d", MatchIn: "-i", MatchOut: "-o"}[k]
			v := m.Name
			if k == MatchSrc || k == MatchDst {
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
			mods = append(mods, strings.Fields(fmt.Sprintf("-m mark %s--mark 0x%x", not(m.Not), m.Value))...)
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
		return []string{"-j", "MARK", "--set-xmark", fmt.Sprintf("0x%x/0xffffffff", t.Mark)}
	case ConnmarkSave:
		return []string{"-j", "CONNMARK", "--save-mark", "--nfmask", "0xffffffff", "--ctmask", "0xffffffff"}
	case ConnmarkRestore:
		return []string{"-j", "CONNMARK", "--restore-mark", "--nfmask", "0xffffffff", "--ctmask", "0xffffffff"}
	case CTZone:
		return []string{"-j", "CT", "--zone", fmt.Sprint(t.Zone)}
	case Masquerade:
		return []string{"-j", "MASQUERADE"}
	}
	panic(fmt.Sprintf("unknown target kind %d", t.Kind))
}

// NFT renders the rule as an nft rule statement as istio-nftables writes
// it: the matches in order, a counter, the target; chainName gives the nft
// name of a jump's chain.
func (r Rule) NFT(chainName func(string) string) string {
	return r.nft(nftStyle{chainName: chainName, counter: true})
}

// nftStyle is how a rule's statement is written: with a counter (as
// istio-nftables writes its rules), addresses always as prefixes (it writes
// 127.0.0.6/32) or single addresses bare (as nft lists them).
type nftStyle struct {
	chainName func(string) string
	counter   bool
}

func (r Rule) nft(st nftStyle) string {
	counter := ""
	if st.counter {
		counter = "counter "
	}
	chainName := st.chainName
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
			if !st.counter && m.Prefix.IsSingleIP() {
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
			a = append(a, fmt.Sprintf("meta mark %s0x%x", op(m.Not), m.Value))
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
		}
	}
	t := r.Target
	switch t.Kind {
	case Jump:
		a = append(a, counter+"jump "+chainName(t.Chain))
	case Return:
		a = append(a, counter+"return")
	case Accept:
		a = append(a, counter+"accept")
	case Drop:
		a = append(a, counter+"drop")
	case Redirect:
		a = append(a, fmt.Sprintf("%sredirect to :%d", counter, t.Port))
	case TProxy:
		ip := "ip"
		if r.Family == V6 {
			ip = "ip6"
		}
		a = append(a, fmt.Sprintf("tproxy %s to :%d meta mark set 0x%x %saccept", ip, t.Port, t.Mark, counter))
	case SetMark:
		a = append(a, fmt.Sprintf("%smeta mark set 0x%x", counter, t.Mark))
	case ConnmarkSave:
		a = append(a, counter+"ct mark set meta mark")
	case ConnmarkRestore:
		a = append(a, counter+"meta mark set ct mark")
	case CTZone:
		a = append(a, fmt.Sprintf("%sct zone set %d", counter, t.Zone))
	case Masquerade:
		a = append(a, counter+"masquerade")
	}
	if r.Comment != "" {
		a = append(a, fmt.Sprintf("comment %q", r.Comment))
	}
	return strings.Join(a, " ")
}
