package intercept

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// Family is an address family: 4 or 6 (firewall's, defined once).
type Family = ruleset.IPVersion

const (
	V4 = ruleset.V4
	V6 = ruleset.V6
)

// Table names, as iptables spells them.
const (
	Raw    = "raw"
	Mangle = "mangle"
	NAT    = "nat"
)

// tableOrder is the order tables appear in iptables-restore payloads.
var tableOrder = []string{Raw, Mangle, NAT}

// Chain names: istio-iptables' own, so that people and tools that know
// them find their way (nftables spells them in lower case with dashes:
// NftChain). Every rule meshwire puts into a built-in iptables chain also
// carries a comment with Tag, so that it can be found again.
const (
	ChainInbound    = "ISTIO_INBOUND"
	ChainRedirect   = "ISTIO_REDIRECT"
	ChainInRedirect = "ISTIO_IN_REDIRECT"
	ChainOutput     = "ISTIO_OUTPUT"
	ChainDivert     = "ISTIO_DIVERT"
	ChainTProxy     = "ISTIO_TPROXY"
	ChainOutputDNS  = "ISTIO_OUTPUT_DNS"
	ChainDrop       = "ISTIO_DROP"
	// ChainInboundDNS is where earlier meshwire versions kept the raw table's
	// inbound DNS zone rules (istio uses ISTIO_INBOUND): still removed.
	ChainInboundDNS = "ISTIO_INBOUND_DNS"
)

// OwnChains are every user chain meshwire (and istio-iptables) may create:
// cleanup removes them from every table.
var OwnChains = []string{ChainInbound, ChainRedirect, ChainInRedirect, ChainOutput, ChainDivert, ChainTProxy, ChainOutputDNS, ChainDrop, ChainInboundDNS}

// IsOwnChain reports whether name is one of OwnChains.
func IsOwnChain(name string) bool { return slices.Contains(OwnChains, name) }

// Tag prefixes the comment on every rule meshwire adds to a built-in chain;
// the rest of the comment is the fingerprint of the rule set it belongs to.
const Tag = "meshwire-intercept"

// NftChain is the nftables name of a chain: istio-nftables' lower case
// with dashes (ISTIO_IN_REDIRECT is istio-in-redirect, PREROUTING is
// prerouting).
func NftChain(chain string) string {
	return strings.ReplaceAll(strings.ToLower(chain), "_", "-")
}

// The vocabulary of the rules Build writes: targets, matches, owners.

func rule(chain string, t ruleset.Target, m ...ruleset.Match) ruleset.Rule {
	return ruleset.Rule{Chain: chain, Match: m, Target: t}
}

func jump(chain string) ruleset.Target    { return ruleset.Target{Kind: ruleset.Jump, Chain: chain} }
func ret() ruleset.Target                 { return ruleset.Target{Kind: ruleset.Return} }
func redirect(port uint16) ruleset.Target { return ruleset.Target{Kind: ruleset.Redirect, Port: port} }
func zone(z uint16) ruleset.Target        { return ruleset.Target{Kind: ruleset.CTZone, Zone: z} }

func in(ifc string) ruleset.Match      { return ruleset.Match{Kind: ruleset.MatchIn, Name: ifc} }
func out(ifc string) ruleset.Match     { return ruleset.Match{Kind: ruleset.MatchOut, Name: ifc} }
func proto(p string) ruleset.Match     { return ruleset.Match{Kind: ruleset.MatchProto, Name: p} }
func src(p netip.Prefix) ruleset.Match { return ruleset.Match{Kind: ruleset.MatchSrc, Prefix: p} }
func dst(p netip.Prefix) ruleset.Match { return ruleset.Match{Kind: ruleset.MatchDst, Prefix: p} }
func notDst(p netip.Prefix) ruleset.Match {
	return ruleset.Match{Kind: ruleset.MatchDst, Prefix: p, Not: true}
}
func sport(p string, port uint16) ruleset.Match {
	return ruleset.Match{Kind: ruleset.MatchSPort, Name: p, Ports: []uint16{port}}
}
func dport(p string, ports ...uint16) ruleset.Match {
	return ruleset.Match{Kind: ruleset.MatchDPort, Name: p, Ports: ports}
}
func notDport(p string, ports ...uint16) ruleset.Match {
	return ruleset.Match{Kind: ruleset.MatchDPort, Name: p, Ports: ports, Not: true}
}
func mark(v uint32) ruleset.Match { return ruleset.Match{Kind: ruleset.MatchMark, Value: v} }
func notMark(v uint32) ruleset.Match {
	return ruleset.Match{Kind: ruleset.MatchMark, Value: v, Not: true}
}
func connmark(v uint32) ruleset.Match  { return ruleset.Match{Kind: ruleset.MatchConnMark, Value: v} }
func ctstate(s string) ruleset.Match   { return ruleset.Match{Kind: ruleset.MatchCTState, Name: s} }
func owner(o Owner) ruleset.Match      { return o.match(false) }
func notOwner(o Owner) ruleset.Match   { return o.match(true) }
func single(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// Owner is a proxy uid or gid.
type Owner struct {
	ID  uint32
	GID bool
}

func (o Owner) match(neg bool) ruleset.Match {
	k := ruleset.MatchUID
	if o.GID {
		k = ruleset.MatchGID
	}
	return ruleset.Match{Kind: k, Value: o.ID, Not: neg}
}
