package apply

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/internal/intercept"
)

// Interception settings as the eBPF programs' map entries (package pods
// writes them, the fast path keeps a copy): the conversion lives here,
// beside interception, so that ebpf/ needs nothing of interception.

// EBPF mode's limits are struct pod_capture's: these fail to compile when
// intercept's and pods' differ.
var (
	_ [intercept.MaxEBPFOwners - pods.MaxOwners]struct{}
	_ [pods.MaxOwners - intercept.MaxEBPFOwners]struct{}
	_ [intercept.MaxEBPFGroups - pods.MaxGroups]struct{}
	_ [pods.MaxGroups - intercept.MaxEBPFGroups]struct{}
)

// ErrUnsupportedSetting marks a setting the ebpf mode does not implement.
var ErrUnsupportedSetting = errors.New("not available in ebpf interception mode")

func unsupportedSetting(format string, a ...any) error {
	return fmt.Errorf("%s: %w (use REDIRECT or TPROXY for it)", fmt.Sprintf(format, a...), ErrUnsupportedSetting)
}

// SettingsOf turns a pod's interception config, its own addresses (the
// destinations its connections reach over lo) and whether its IPv6 is
// intercepted (WantIPv6: else pods.FlagIPv4Only, as the rules would have
// no IPv6 half) into its map entries. The settings the ebpf mode does not
// implement are errors naming them.
func SettingsOf(c intercept.Config, local []netip.Addr, ipv6 bool) (pods.Settings, error) {
	var s pods.Settings
	switch {
	case len(c.KubeVirtInterfaces) > 0:
		return s, unsupportedSetting("kube-virt-interfaces")
	case len(c.ProxyUIDs)+len(c.ProxyGIDs) > pods.MaxOwners:
		return s, unsupportedSetting("more than %d proxy uids and gids together", pods.MaxOwners)
	case len(c.OutboundGroups.GIDs) > pods.MaxGroups:
		return s, unsupportedSetting("more than %d owner groups", pods.MaxGroups)
	}
	p := &s.Capture
	p.OutboundPort, p.InboundPort, p.TunnelPort = c.ProxyPort, c.InboundCapturePort, c.InboundTunnelPort
	if !ipv6 {
		p.Flags |= pods.FlagIPv4Only
	}
	for _, u := range c.ProxyUIDs {
		p.OwnerID[p.Owners] = u
		p.Owners++
	}
	for _, g := range c.ProxyGIDs {
		p.OwnerGID |= 1 << p.Owners
		p.OwnerID[p.Owners] = g
		p.Owners++
	}
	for _, g := range c.OutboundGroups.GIDs {
		p.Group[p.Groups] = g
		p.Groups++
	}
	if c.OutboundGroups.Only {
		p.Flags |= pods.FlagGroupsOnly
	}
	lo := c.IPv4Loopback
	if !lo.IsValid() {
		lo = netip.MustParsePrefix("127.0.0.1/32")
	}
	if !lo.Addr().Is4() {
		return s, fmt.Errorf("IPv4 loopback range %s is not IPv4", lo)
	}
	p.Lo4 = lo.Masked().Addr().As4()
	mask := ^uint32(0) << (32 - lo.Bits())
	if lo.Bits() == 0 {
		mask = 0
	}
	p.Lo4Mask = [4]byte{byte(mask >> 24), byte(mask >> 16), byte(mask >> 8), byte(mask)}
	if c.OutboundCIDRs.All {
		p.Flags |= pods.FlagOutAll
	}
	for _, pr := range c.OutboundCIDRs.Prefixes {
		if pr.Addr().Unmap().IsLoopback() {
			p.Flags |= pods.FlagLoopbackIncluded
		}
	}
	if !c.InboundPorts.Empty() {
		p.Flags |= pods.FlagIn
	}
	if c.InboundPorts.All {
		p.Flags |= pods.FlagInAll
	}
	port := func(kind uint8, ports ...uint16) {
		for _, n := range ports {
			s.Ports = append(s.Ports, pods.PortKey{Port: n, Kind: kind})
		}
	}
	port(pods.PortOutExclude, c.OutboundPortsExclude...)
	port(pods.PortOutInclude, c.OutboundPorts...)
	if c.InboundPorts.All {
		port(pods.PortInExclude, c.InboundPortsExclude...)
	} else {
		port(pods.PortInInclude, c.InboundPorts.Ports...)
	}
	cidr := func(kind uint32, pr netip.Prefix) {
		a := pr.Masked().Addr()
		bits := pr.Bits()
		if a.Is4() {
			bits += 96
		}
		s.CIDRs = append(s.CIDRs, pods.CIDRKey{Prefixlen: uint32(32 + 64 + bits), Kind: kind, Addr: a.As16()})
	}
	for _, pr := range c.OutboundCIDRsExclude {
		cidr(pods.CIDRExclude, pr)
	}
	if !c.OutboundCIDRs.All {
		for _, pr := range c.OutboundCIDRs.Prefixes {
			cidr(pods.CIDRInclude, pr)
		}
	}
	// DNS capture as the rules have it: on only with servers to capture
	// (or all of them).
	if c.RedirectDNS && (c.CaptureAllDNS || len(c.DNSServers) > 0) {
		p.Flags |= pods.FlagDNS
		if c.CaptureAllDNS {
			p.Flags |= pods.FlagDNSAll
		}
		for _, a := range c.DNSServers {
			a = a.Unmap()
			cidr(pods.CIDRDNS, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	for _, a := range local {
		a = a.Unmap()
		if !a.IsLoopback() {
			cidr(pods.CIDRLocal, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return s, nil
}

// MirrorOf is what the fast path keeps of a meshed pod's interception
// (under loader.RulesDir, written with Register): its outbound settings
// for the rules' verdict (fastpath.c tracks only what they capture), or,
// in EBPF mode, pods.FlagEBPFMode. DNS capture is left out: the fast path
// carries TCP between an application and its sidecar's outbound port.
func MirrorOf(c intercept.Config, local []netip.Addr, ipv6 bool) (pods.Settings, error) {
	s, err := SettingsOf(c, local, ipv6)
	if err != nil {
		return s, err
	}
	s.Capture.Flags &^= pods.FlagDNS | pods.FlagDNSAll
	s.CIDRs = slices.DeleteFunc(s.CIDRs, func(k pods.CIDRKey) bool { return k.Kind == pods.CIDRDNS })
	if c.Mode == intercept.ModeEBPF {
		s.Capture.Flags |= pods.FlagEBPFMode
	}
	return s, nil
}
