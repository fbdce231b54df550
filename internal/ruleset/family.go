// Package ruleset is the typed model of what meshwire writes to the
// firewall: the families, rules (matches in order, a target), tables and
// chains, and Tx, a transaction of typed operations on them, in the
// manner of knftables. Features build transactions as values; the
// firewall (internal/firewall) renders and applies them (fwtext, the
// text of iptables-restore and nft; fwnetlink, netlink) and its fake
// (fwfake) applies the same operations. What the host holds, read back,
// is the other layer: internal/firewall/installed. It touches no kernel.
package ruleset

import "fmt"

// Family is the family of an nf_tables table (NFPROTO_*): the one such
// type of the project (internal/firewall and internal/nftnl name it too).
// An iptables table of IPv4 is the nf_tables table of family IP with the
// same name (iptables-nft keeps it there; for iptables-legacy the family
// is only a name).
type Family byte

const (
	Inet   Family = 1  // NFPROTO_INET
	IP     Family = 2  // NFPROTO_IPV4
	ARP    Family = 3  // NFPROTO_ARP
	Netdev Family = 5  // NFPROTO_NETDEV
	Bridge Family = 7  // NFPROTO_BRIDGE
	IP6    Family = 10 // NFPROTO_IPV6
)

// String is the nft keyword of the family.
func (f Family) String() string {
	switch f {
	case IP:
		return "ip"
	case IP6:
		return "ip6"
	case Inet:
		return "inet"
	case Bridge:
		return "bridge"
	case ARP:
		return "arp"
	case Netdev:
		return "netdev"
	}
	return fmt.Sprintf("family-%d", byte(f))
}

// Name is String: the nft keyword of the family.
func (f Family) Name() string { return f.String() }

// ParseFamily reads an nft family keyword.
func ParseFamily(s string) (Family, error) {
	for _, f := range []Family{IP, IP6, Inet, Bridge, ARP, Netdev} {
		if f.String() == s {
			return f, nil
		}
	}
	return 0, fmt.Errorf("unknown nftables family %q", s)
}

// IPVersion is an address family: 4 or 6.
type IPVersion int

const (
	V4 IPVersion = 4
	V6 IPVersion = 6
)

func (v IPVersion) String() string { return fmt.Sprintf("IPv%d", int(v)) }

// Tables is the table family that holds v's iptables tables.
func (v IPVersion) Tables() Family {
	if v == V6 {
		return IP6
	}
	return IP
}
