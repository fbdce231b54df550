package main

import (
	"fmt"
	"net"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// An attachment is an attachment.ID: one (container, interface) pair on
// the node. Its rules are found by its key (attachment.ID.PortmapKeys: the
// current key and the older one), a hash of the container id and the
// interface name only: a DEL after the network was renamed, or without
// portMappings and prevResult, still finds them.

// tagPrefix starts the comment that describes an attachment chain.
const tagPrefix = "meshwire-portmap"

// tag is the human-readable comment on the attachment's chain: which
// network (attachment.NetworkTag), interface and container it serves. GC
// uses the network part to stay within its network; the container id is
// informational (truncated to fit the backend's comment limit).
func tag(a attachment.ID, limit int) string {
	s := fmt.Sprintf("%s net=%s if=%s id=%s", tagPrefix, attachment.NetworkTag(a.Network), a.IfName, a.ContainerID)
	if len(s) > limit {
		s = s[:limit]
	}
	return s
}

// tagNetwork returns the net= part of a tag, or "" when the comment is not
// a meshwire portmap tag.
func tagNetwork(comment string) string {
	f := strings.Fields(comment)
	if len(f) < 2 || f[0] != tagPrefix || !strings.HasPrefix(f[1], "net=") {
		return ""
	}
	return strings.TrimPrefix(f[1], "net=")
}

// containerAddrs picks the container's first IPv4 and first IPv6 address on
// ifName from prevResult, as the reference plugin does: addresses of other
// interfaces, and of host-side interfaces (no sandbox), are skipped.
func containerAddrs(r *current.Result, ifName string) (v4, v6 *net.IPNet) {
	if r == nil {
		return nil, nil
	}
	for _, ip := range r.IPs {
		if ip.Interface != nil {
			i := *ip.Interface
			if i >= 0 && i < len(r.Interfaces) && (r.Interfaces[i].Name != ifName || r.Interfaces[i].Sandbox == "") {
				continue
			}
		}
		a := ip.Address
		if a.IP.To4() != nil {
			if v4 == nil && len(a.Mask) >= 4 {
				v4 = &net.IPNet{IP: a.IP.To4(), Mask: a.Mask[len(a.Mask)-4:]}
			}
		} else if v6 == nil {
			n := a
			v6 = &n
		}
	}
	return v4, v6
}

// action is what a rule does with a matching packet.
type action int

const (
	// actMark marks the connection for masquerade (hairpin, localhost,
	// masqAll).
	actMark action = iota
	// actDNAT rewrites the destination to the container.
	actDNAT
)

// rule is one backend-neutral port-mapping rule inside an attachment chain.
type rule struct {
	Proto    string
	HostPort int
	HostIP   net.IP     // nil: any local address
	Src      *net.IPNet // actMark: sources to mark; nil: every source
	Action   action
	To       net.IP // actDNAT
	ToPort   int    // actDNAT
}

// famPlan is everything one ADD installs for one address family.
type famPlan struct {
	Family ruleset.IPVersion
	Key    string
	Att    attachment.ID
	Conds  []string
	// MarkBit is meshwire's masquerade mark bit, or -1 when nothing is
	// marked (snat off) or marking is external.
	MarkBit int
	// ExternalMark is externalSetMarkChain (iptables only).
	ExternalMark string
	Rules        []rule
}

// plan turns the config and the container addresses into per-family rule
// lists. A family is planned only when the container has an address in it
// and at least one mapping applies to it (a hostIP of the other family does
// not).
func plan(c *config, a attachment.ID, v4, v6 *net.IPNet) []famPlan {
	var out []famPlan
	for _, fam := range []struct {
		f     ruleset.IPVersion
		addr  *net.IPNet
		conds []string
	}{{ruleset.V4, v4, c.CondV4}, {ruleset.V6, v6, c.CondV6}} {
		if fam.addr == nil {
			continue
		}
		p := famPlan{Family: fam.f, Key: a.PortmapKey(), Att: a, Conds: fam.conds, MarkBit: -1, ExternalMark: c.ExternalSetMarkChain}
		if c.SNAT && c.ExternalSetMarkChain == "" {
			p.MarkBit = c.MarkBit
		}
		for _, m := range c.Mappings {
			if !appliesTo(m, fam.f) {
				continue
			}
			base := rule{Proto: m.Protocol, HostPort: m.HostPort}
			if m.HostIP != nil && !m.HostIP.IsUnspecified() {
				base.HostIP = m.HostIP
			}
			if c.SNAT {
				hp := base
				hp.Action = actMark
				if !c.MasqAll {
					subnet := &net.IPNet{IP: fam.addr.IP.Mask(fam.addr.Mask), Mask: fam.addr.Mask}
					hp.Src = subnet
				}
				p.Rules = append(p.Rules, hp)
				if fam.f == ruleset.V4 && !c.MasqAll {
					lo := base
					lo.Action = actMark
					lo.Src = &net.IPNet{IP: net.IPv4(127, 0, 0, 1).To4(), Mask: net.CIDRMask(32, 32)}
					p.Rules = append(p.Rules, lo)
				}
			}
			d := base
			d.Action, d.To, d.ToPort = actDNAT, fam.addr.IP, m.ContainerPort
			p.Rules = append(p.Rules, d)
		}
		if len(p.Rules) > 0 {
			out = append(out, p)
		}
	}
	return out
}

func appliesTo(m mapping, f ruleset.IPVersion) bool {
	if m.HostIP == nil {
		return true
	}
	return (m.HostIP.To4() != nil) == (f == ruleset.V4)
}

// needsLocalnet reports whether 127.0.0.1 can be a destination of the IPv4
// mappings and the host's loopback traffic gets masqueraded: then the host
// interface toward the container needs route_localnet.
func needsLocalnet(c *config) bool {
	if !c.SNAT {
		return false
	}
	for _, m := range c.Mappings {
		if m.HostIP == nil || (m.HostIP.To4() != nil && (m.HostIP.IsUnspecified() || m.HostIP.IsLoopback())) {
			return true
		}
	}
	return false
}

// udpPorts lists the UDP host ports of the mappings that apply to a family.
func udpPorts(ms []mapping, f ruleset.IPVersion) []int {
	var out []int
	for _, m := range ms {
		if m.Protocol == "udp" && appliesTo(m, f) {
			out = append(out, m.HostPort)
		}
	}
	return out
}
