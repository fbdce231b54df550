package ruleset

import (
	"net/netip"
	"slices"
	"strings"
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
	// MatchProtoModule is the protocol's own match module with no option
	// (Name: "tcp"): iptables' "-m tcp" after "-p tcp", which
	// iptables-save prints back; nft has nothing to write for it.
	MatchProtoModule
	// MatchSocketExists: a local socket owns the packet (iptables' -m
	// owner --socket-exists; iptables only, nft has no such match).
	MatchSocketExists
	// MatchDstSet: the destination address is in the set Name (iptables:
	// -m set --match-set Name dst, an ipset; nft: ip daddr @Name, a set of
	// the rule's table, ip6 for a rule of Family V6).
	MatchDstSet
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
	// Mask of MatchMark and MatchConnMark: (mark & Mask) == Value; 0
	// compares the whole mark.
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
	SNAT            // SNAT --to-source To (nft: snat ip to To)
	// ConnmarkSet sets the bits Mask of the connection mark to Mark
	// (CONNMARK --set-xmark Mark/Mask; nft: ct mark set ct mark & ^Mask |
	// Mark).
	ConnmarkSet
)

// Target is what a rule does with a matching packet.
type Target struct {
	Kind  TargetKind
	Chain string // Jump
	Port  uint16 // Redirect, TProxy
	Mark  uint32 // TProxy, SetMark, ConnmarkSet
	// Mask of SetMark and ConnmarkSet: the bits set (MARK --set-xmark
	// Mark/Mask); 0 sets the whole mark. A Mask equal to Mark sets those
	// bits (nft: or).
	Mask uint32
	Zone uint16         // CTZone
	To   netip.AddrPort // DNAT, SNAT (port 0: the address only)
}

// SetBits is the Mask of SetMark and ConnmarkSet as the bits it sets: 0
// means the whole mark.
func (t Target) SetBits() uint32 {
	if t.Mask == 0 {
		return 0xffffffff
	}
	return t.Mask
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

// BuiltinHook is the netfilter hook of an iptables built-in chain
// ("prerouting" for PREROUTING), "" for any other chain.
func BuiltinHook(chain string) string {
	if IsBuiltin(chain) {
		return strings.ToLower(chain)
	}
	return ""
}
