package intercept

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/meshwire/meshwire/internal/firewall"
)

// Family is an address family: 4 or 6 (firewall's, defined once).
type Family = firewall.Family

const (
	V4 = firewall.V4
	V6 = firewall.V6
)

// Table names, as iptables spells them.
const (
	Raw    = "raw"
	Mangle = "mangle"
	NAT    = "nat"
)

// tableOrder is the order tables appear in payloads and scripts.
var tableOrder = []string{Raw, Mangle, NAT}

// Chain names. The user chains keep istio-iptables' names so that people and
// tools that know those find their way; every rule meshwire puts into a
// built-in chain carries a comment with Tag so that it can be found again.
const (
	ChainInbound    = "ISTIO_INBOUND"
	ChainRedirect   = "ISTIO_REDIRECT"
	ChainInRedirect = "ISTIO_IN_REDIRECT"
	ChainOutput     = "ISTIO_OUTPUT"
	ChainDivert     = "ISTIO_DIVERT"
	ChainTProxy     = "ISTIO_TPROXY"
	ChainOutputDNS  = "ISTIO_OUTPUT_DNS"
	ChainInboundDNS = "ISTIO_INBOUND_DNS"
)

// OwnChains are every user chain meshwire (and istio-iptables) may create:
// cleanup removes them from every table.
var OwnChains = []string{ChainInbound, ChainRedirect, ChainInRedirect, ChainOutput, ChainDivert, ChainTProxy, ChainOutputDNS, ChainInboundDNS}

// IsOwnChain reports whether name is one of OwnChains.
func IsOwnChain(name string) bool { return slices.Contains(OwnChains, name) }

// IsBuiltin reports whether a chain is one of the kernel's built-in chains.
func IsBuiltin(chain string) bool {
	switch chain {
	case "PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING":
		return true
	}
	return false
}

// Tag prefixes the comment on every rule meshwire adds to a built-in chain;
// the rest of the comment is the fingerprint of the rule set it belongs to.
const Tag = "meshwire-intercept"

// Target kinds.
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
)

// Target is what a rule does with a matching packet.
type Target struct {
	Kind  TargetKind
	Chain string // Jump
	Port  uint16 // Redirect, TProxy
	Mark  uint32 // TProxy, SetMark
	Zone  uint16 // CTZone
}

// Owner matches the socket owner of locally generated packets.
type Owner struct {
	ID  uint32
	GID bool // match the group, not the user
	Not bool
}

// Rule is one firewall rule in a backend-neutral form. Zero values mean
// "don't match on this".
type Rule struct {
	Chain    string
	Proto    string // "tcp", "udp" or ""
	In, Out  string // interface names
	Src, Dst netip.Prefix
	NotDst   bool
	SPort    uint16
	DPort    uint16
	NotDPort bool
	Mark     uint32
	NotMark  bool
	ConnMark uint32
	CTState  string // "RELATED,ESTABLISHED" or "INVALID"
	CTDir    string // with CTState: "ORIGINAL" or "REPLY"
	Owners   []Owner
	Target   Target
}

// IPTables renders the rule's arguments after "-A CHAIN" as iptables-save
// would read them back (comment excluded).
func (r Rule) IPTables() []string {
	var a []string
	if r.In != "" {
		a = append(a, "-i", r.In)
	}
	if r.Out != "" {
		a = append(a, "-o", r.Out)
	}
	if r.Src.IsValid() {
		a = append(a, "-s", r.Src.String())
	}
	if r.Dst.IsValid() {
		if r.NotDst {
			a = append(a, "!")
		}
		a = append(a, "-d", r.Dst.String())
	}
	if r.Proto != "" {
		a = append(a, "-p", r.Proto)
	}
	if r.SPort != 0 || r.DPort != 0 {
		a = append(a, "-m", r.Proto)
	}
	if r.SPort != 0 {
		a = append(a, "--sport", fmt.Sprint(r.SPort))
	}
	if r.DPort != 0 {
		if r.NotDPort {
			a = append(a, "!")
		}
		a = append(a, "--dport", fmt.Sprint(r.DPort))
	}
	if r.Mark != 0 {
		a = append(a, "-m", "mark")
		if r.NotMark {
			a = append(a, "!")
		}
		a = append(a, "--mark", fmt.Sprintf("0x%x", r.Mark))
	}
	if r.ConnMark != 0 {
		a = append(a, "-m", "connmark", "--mark", fmt.Sprintf("0x%x", r.ConnMark))
	}
	if r.CTState != "" {
		a = append(a, "-m", "conntrack", "--ctstate", r.CTState)
		if r.CTDir != "" {
			a = append(a, "--ctdir", r.CTDir)
		}
	}
	for _, o := range r.Owners {
		a = append(a, "-m", "owner")
		if o.Not {
			a = append(a, "!")
		}
		if o.GID {
			a = append(a, "--gid-owner", fmt.Sprint(o.ID))
		} else {
			a = append(a, "--uid-owner", fmt.Sprint(o.ID))
		}
	}
	return append(a, r.Target.iptables()...)
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
	}
	panic(fmt.Sprintf("unknown target kind %d", t.Kind))
}

// NFT renders the rule as an nft rule statement for a table of family f.
// chainName maps the rule's jump target to its nft chain name.
func (r Rule) NFT(f Family, chainName func(string) string) string {
	ip := "ip"
	if f == V6 {
		ip = "ip6"
	}
	var a []string
	if r.In != "" {
		a = append(a, fmt.Sprintf("iifname %q", r.In))
	}
	if r.Out != "" {
		a = append(a, fmt.Sprintf("oifname %q", r.Out))
	}
	if r.Src.IsValid() {
		a = append(a, ip+" saddr "+r.Src.String())
	}
	if r.Dst.IsValid() {
		op := ""
		if r.NotDst {
			op = "!= "
		}
		a = append(a, ip+" daddr "+op+r.Dst.String())
	}
	if r.Proto != "" && r.SPort == 0 && r.DPort == 0 {
		a = append(a, "meta l4proto "+r.Proto)
	}
	if r.SPort != 0 {
		a = append(a, fmt.Sprintf("%s sport %d", r.Proto, r.SPort))
	}
	if r.DPort != 0 {
		op := ""
		if r.NotDPort {
			op = "!= "
		}
		a = append(a, fmt.Sprintf("%s dport %s%d", r.Proto, op, r.DPort))
	}
	if r.Mark != 0 {
		op := ""
		if r.NotMark {
			op = "!= "
		}
		a = append(a, fmt.Sprintf("meta mark %s0x%x", op, r.Mark))
	}
	if r.ConnMark != 0 {
		a = append(a, fmt.Sprintf("ct mark 0x%x", r.ConnMark))
	}
	if r.CTState != "" {
		a = append(a, "ct state "+strings.ToLower(r.CTState))
		if r.CTDir != "" {
			a = append(a, "ct direction "+strings.ToLower(r.CTDir))
		}
	}
	for _, o := range r.Owners {
		key := "skuid"
		if o.GID {
			key = "skgid"
		}
		op := ""
		if o.Not {
			op = "!= "
		}
		a = append(a, fmt.Sprintf("meta %s %s%d", key, op, o.ID))
	}
	t := r.Target
	switch t.Kind {
	case Jump:
		a = append(a, "jump "+chainName(t.Chain))
	case Return:
		a = append(a, "return")
	case Accept:
		a = append(a, "accept")
	case Drop:
		a = append(a, "drop")
	case Redirect:
		a = append(a, fmt.Sprintf("redirect to :%d", t.Port))
	case TProxy:
		// iptables' TPROXY drops what finds no socket; nft's tproxy lets it
		// go on, so Nft follows each tproxy rule with a drop.
		a = append(a, fmt.Sprintf("meta mark set 0x%x tproxy to :%d accept", t.Mark, t.Port))
	case SetMark:
		a = append(a, fmt.Sprintf("meta mark set 0x%x", t.Mark))
	case ConnmarkSave:
		a = append(a, "ct mark set meta mark")
	case ConnmarkRestore:
		a = append(a, "meta mark set ct mark")
	case CTZone:
		a = append(a, fmt.Sprintf("ct zone set %d", t.Zone))
	}
	return strings.Join(a, " ")
}
