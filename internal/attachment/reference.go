package attachment

// The names the reference plugins (github.com/containernetworking/plugins,
// v1.9.1 and Debian's 1.1.1) give what they create on the host for an
// attachment. meshwire never creates these; it only finds them, so that a
// node switched to meshwire in place tears down the pods the reference set
// up (see internal/refrules). Every name is computed exactly as the
// reference computes it; the tests pin values the reference's own code
// produced.

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"strings"
)

// Reference is one attachment as the reference plugins name it: the
// network name, the container id and (nftables ipMasq only) the interface.
type Reference struct {
	Network     string
	ContainerID string
	IfName      string
}

// The reference's shared objects, which hold the per-attachment ones.
const (
	// ipMasq with iptables: POSTROUTING jumps to the attachment's chain.
	RefMasqEntryChain = "POSTROUTING"

	// ipMasq with nftables (v1.9.1 only): one rule per pod address in chain
	// masq_checks of table inet cni_plugins_masquerade, commented with
	// RefMasqNftComment.
	RefMasqTable    = "cni_plugins_masquerade"
	RefMasqNftChain = "masq_checks"

	// portmap with iptables: CNI-HOSTPORT-DNAT (from PREROUTING and OUTPUT)
	// jumps to the attachment's CNI-DN chain; releases before 0.7 had a
	// CNI-HOSTPORT-SNAT chain jumping to CNI-SN chains. SETMARK and MASQ
	// are shared and hold nothing of any one attachment.
	RefHostportDNAT    = "CNI-HOSTPORT-DNAT"
	RefHostportSNAT    = "CNI-HOSTPORT-SNAT"
	RefHostportSetMark = "CNI-HOSTPORT-SETMARK"
	RefHostportMasq    = "CNI-HOSTPORT-MASQ"

	// portmap with nftables (v1.9.1 only): tables ip and ip6 cni_hostport;
	// the attachment's rules sit in RefHostportNftChains, commented with the
	// bare container id.
	RefHostportTable = "cni_hostport"
)

// RefHostportNftChains are the chains of table cni_hostport that hold
// rules of single attachments (those the reference's DEL looks into).
var RefHostportNftChains = []string{"hostports", "hostip_hostports", "masquerading"}

// refHash is the reference's utils.MustFormatHashWithPrefix: prefix, then
// sha512(toHash) in hex, cut to length.
func refHash(length int, prefix, toHash string) string {
	sum := sha512.Sum512([]byte(toHash))
	return (prefix + hex.EncodeToString(sum[:]))[:length]
}

// refChainLength is the length of every per-attachment iptables chain.
const refChainLength = 28

// MasqChain is the ipMasq chain of the attachment with iptables,
// "CNI-" and a hash of network and container id (utils.FormatChainName;
// the interface plays no part).
func (r Reference) MasqChain() string {
	return refHash(refChainLength, "CNI-", r.Network+r.ContainerID)
}

// MasqComment is the comment of the ipMasq rules with iptables: the POSTROUTING
// jump and the chain's two rules (utils.FormatComment).
func (r Reference) MasqComment() string {
	return fmt.Sprintf("name: %q id: %q", r.Network, r.ContainerID)
}

// RefMasqNftNetworkHash starts the comment of every nftables ipMasq rule of
// the network: what the reference's GC looks for.
func RefMasqNftNetworkHash(network string) string {
	return refHash(16, "", network)
}

// MasqNftKey starts the comment of the attachment's nftables ipMasq rules:
// the network's hash, "-", and a hash of interface and container id.
func (r Reference) MasqNftKey() string {
	return RefMasqNftNetworkHash(r.Network) + "-" + refHash(16, "", r.IfName+":"+r.ContainerID)
}

// refNftCommentMax is knftables.CommentLengthMax.
const refNftCommentMax = 128

// MasqNftComment is the full comment of the attachment's nftables ipMasq
// rules, cut to nftables' 128 bytes as the reference cuts it.
func (r Reference) MasqNftComment() string {
	unquote := func(s string) string { return strings.ReplaceAll(s, `"`, ``) }
	c := fmt.Sprintf("%s, net: %s, if: %s, id: %s", r.MasqNftKey(), unquote(r.Network), unquote(r.IfName), unquote(r.ContainerID))
	if len(c) > refNftCommentMax {
		c = c[:refNftCommentMax]
	}
	return c
}

// PortmapDNATChain is the attachment's portmap chain with iptables,
// "CNI-DN-" and a hash of network and container id.
func (r Reference) PortmapDNATChain() string {
	return refHash(refChainLength, "CNI-DN-", r.Network+r.ContainerID)
}

// PortmapSNATChain is the chain of releases before 0.7 (CNI-SN-), which
// the reference's DEL still removes.
func (r Reference) PortmapSNATChain() string {
	return refHash(refChainLength, "CNI-SN-", r.Network+r.ContainerID)
}

// PortmapDNATComment is the comment of the jumps from CNI-HOSTPORT-DNAT to
// the attachment's chain (cut to 255 bytes as the reference cuts it).
func (r Reference) PortmapDNATComment() string {
	c := fmt.Sprintf(`dnat name: "%s" id: "%s"`, r.Network, r.ContainerID)
	if len(c) > 255 {
		c = c[:253] + "..."
	}
	return c
}

// PortmapNftComment is the comment of the attachment's nftables portmap
// rules: the container id alone.
func (r Reference) PortmapNftComment() string { return r.ContainerID }

// IfbName is the reference bandwidth plugin's ifb device of the attachment
// ("bwp" and a hash of network and container id, 15 bytes).
func (r Reference) IfbName() string {
	return refHash(15, "bwp", r.Network+r.ContainerID)
}
