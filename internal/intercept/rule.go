package intercept

import (
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
