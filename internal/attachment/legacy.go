package attachment

import (
	"crypto/sha256"
	"encoding/hex"
)

// The older forms of names meshwire itself gave before this package (up to
// commit ee1ca85). Nothing creates them any more; DEL, CHECK and GC still
// look for them, so that attachments made by an older meshwire are checked
// and cleaned up after an upgrade. See the package doc for the table.

// LegacyPortmapKey is the older port mapping key: 16 hex digits of
// sha256(containerID NUL ifName).
func LegacyPortmapKey(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "\x00" + ifName))
	return hex.EncodeToString(sum[:PortmapKeyLen/2])
}

// LegacyIfb is the older ifb device name: IfbPrefix and 11 hex digits of
// sha256(network NUL containerID NUL ifName).
func LegacyIfb(network, containerID, ifName string) string {
	return IfbPrefix + hexSum(network + "\x00" + containerID + "\x00" + ifName)[:IFNameSize-len(IfbPrefix)]
}

// LegacyBandwidthNetworkTag is the older network tag of ifb aliases
// (net=...): 12 digits of the network hash.
func LegacyBandwidthNetworkTag(network string) string { return NetworkHash(network)[:12] }
