// Package attachment says how meshwire names, on the host, what it creates
// for an attachment (one container interface on one network) and for a
// network, so that ADD, CHECK, DEL and GC of every plugin find exactly what
// is theirs without keeping state, and never touch what is not.
//
// Two hashes make every name:
//
//   - the attachment hash, hex of sha256(containerID "/" ifName) (ID.Hash).
//     It leaves the network out: a DEL after the network was renamed still
//     finds the attachment's objects, and a container cannot hold two
//     interfaces of one name, so the host veth, which every plugin of the
//     attachment shares, needs no more.
//   - the network hash, hex of sha256(network name) (NetworkHash), for the
//     names and comments that GC of one network uses to stay within it.
//
// Each name takes a documented number of leading hex digits of them:
//
//	object                        name                                   length
//	host end of the pod's veth    <prefix><att[:15-len(prefix)]>          15 (prefix "veth": 11 hex)
//	masquerade tag (iptables)     MW-<net[:8]>-<att[:15]>                 27
//	masquerade table (nftables)   meshwire_masq_<net[:8]>_<att[:15]>      38
//	mac spoof table (nftables)    meshwire_macspoof_<net[:8]>_<att[:15]>  42
//	port mapping key              <att[:16]> (chains MWHP-<key>, pm-<key>) 16
//	ifb device (egress shaping)   mwbw<att[:11]>                          15
//	network tag (comments, alias) <name> when plain, else sha256-<net[:16]> ≤64
//
// Names already on nodes keep working. meshwire before this package
// (up to commit ee1ca85) computed some of them another way; DEL, CHECK and
// GC look for both forms (IfbNames, PortmapKeys and NetworkTags list the
// current form first, then the older one):
//
//	object              older form                                          where it is read
//	port mapping key    hex of sha256(containerID NUL ifName), 16 digits    portmap DEL, CHECK, GC (LegacyPortmapKey)
//	ifb device          mwbw + 11 hex of sha256(net NUL containerID NUL if) bandwidth DEL, CHECK, GC (LegacyIfb)
//	ifb alias net=      12 hex of sha256(network name)                      bandwidth CHECK, GC (LegacyBandwidthNetworkTag)
//
// The host veth, masquerade and mac spoof names have not changed. The names
// the reference plugins (containernetworking/plugins) give their objects are
// in reference.go.
package attachment

import (
	"crypto/sha256"
	"encoding/hex"
)

// ID identifies one attachment: a container's interface on a network, as
// the CNI spec's (network name, container id, interface name) and a GC
// valid list's entries.
type ID struct {
	Network     string
	ContainerID string
	IfName      string
}

// IFNameSize is the kernel's limit on interface names, without the NUL.
const IFNameSize = 15

// hexSum is the hex of sha256(s), 64 digits.
func hexSum(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// Hash is the attachment hash: hex of sha256(ContainerID "/" IfName), 64
// digits; names take a prefix of it. The network is not part of it.
func (a ID) Hash() string { return hexSum(a.ContainerID + "/" + a.IfName) }

// NetworkHash is the network hash: hex of sha256(network), 64 digits.
func NetworkHash(network string) string { return hexSum(network) }

// Digits of the hashes in the names that hold both.
const (
	netDigits = 8
	attDigits = 15
)

// DefaultVethPrefix starts the host end's name when no prefix is
// configured, as with the reference plugins.
const DefaultVethPrefix = "veth"

// MaxVethPrefixLen leaves at least 4 hex digits of hash in a host veth name.
const MaxVethPrefixLen = 11

// HostVeth is the name of the host end of the attachment's veth: prefix
// ("" for DefaultVethPrefix) followed by as many digits of the attachment
// hash as fit in IFNameSize bytes (at least 4). The network is not used.
func (a ID) HostVeth(prefix string) string {
	if prefix == "" {
		prefix = DefaultVethPrefix
	}
	n := max(IFNameSize-len(prefix), 4)
	return prefix + a.Hash()[:n]
}

// MasqTagPrefix starts the masquerade tag of every attachment of network.
func MasqTagPrefix(network string) string {
	return "MW-" + NetworkHash(network)[:netDigits] + "-"
}

// MasqTag is the attachment's masquerade tag with iptables: the first word
// after "meshwire-masq " in the comment of its MASQUERADE rules (27 bytes,
// the shape of a chain name).
func (a ID) MasqTag() string { return MasqTagPrefix(a.Network) + a.Hash()[:attDigits] }

// MasqTablePrefix starts the masquerade table of every attachment of
// network.
func MasqTablePrefix(network string) string {
	return "meshwire_masq_" + NetworkHash(network)[:netDigits] + "_"
}

// MasqTable is the attachment's masquerade table with nftables (family
// inet).
func (a ID) MasqTable() string { return MasqTablePrefix(a.Network) + a.Hash()[:attDigits] }

// MacSpoofTablePrefix starts the mac spoof check table of every attachment
// of network.
func MacSpoofTablePrefix(network string) string {
	return "meshwire_macspoof_" + NetworkHash(network)[:netDigits] + "_"
}

// MacSpoofTable is the attachment's mac spoof check table (family bridge).
func (a ID) MacSpoofTable() string { return MacSpoofTablePrefix(a.Network) + a.Hash()[:attDigits] }

// PortmapKeyLen is the length of a port mapping key, in both forms.
const PortmapKeyLen = 16

// PortmapKey names the attachment's port mapping chains: 16 digits of the
// attachment hash. The network is left out: a DEL after the network was
// renamed, or without portMappings and prevResult, still finds them.
func (a ID) PortmapKey() string { return a.Hash()[:PortmapKeyLen] }

// PortmapKeys lists the keys the attachment's chains may carry on a node:
// PortmapKey, then LegacyPortmapKey.
func (a ID) PortmapKeys() []string {
	return []string{a.PortmapKey(), LegacyPortmapKey(a.ContainerID, a.IfName)}
}

// IfbPrefix starts the name of every ifb device of the bandwidth plugin.
const IfbPrefix = "mwbw"

// Ifb is the attachment's ifb device (egress shaping): IfbPrefix and 11
// digits of the attachment hash, 15 bytes. The device's alias says which
// network it belongs to (NetworkTag).
func (a ID) Ifb() string { return IfbPrefix + a.Hash()[:IFNameSize-len(IfbPrefix)] }

// IfbNames lists the names the attachment's ifb may have on a node: Ifb,
// then LegacyIfb.
func (a ID) IfbNames() []string {
	return []string{a.Ifb(), LegacyIfb(a.Network, a.ContainerID, a.IfName)}
}

// plain reports whether a network name is written as itself in tags: 1 to
// 64 of the characters the CNI spec allows (A-Z a-z 0-9 _ . -).
func plain(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// NetworkTag names a network in comments and aliases (port mapping chain
// comments, ifb aliases): the name itself when it is plain (1 to 64 of
// A-Z a-z 0-9 _ . -), else "sha256-" and 16 digits of the network hash, so
// that it stays quotable and short.
func NetworkTag(network string) string {
	if plain(network) {
		return network
	}
	return "sha256-" + NetworkHash(network)[:16]
}

// NetworkTags lists the tags of network that may be on a node: NetworkTag,
// then LegacyBandwidthNetworkTag.
func NetworkTags(network string) []string {
	return []string{NetworkTag(network), LegacyBandwidthNetworkTag(network)}
}
