// Package intercept is meshwire's interception rule model: which TCP
// connections of a pod go through the sidecar proxy (Config, with
// istio-iptables' meaning and defaults) and its rules. The rules render
// into an iptables-restore payload per address family or one nftables
// script, and are compared with what a namespace holds (ReadState,
// Compare). It touches no kernel; package apply reads the namespace, plans
// and applies the change, for the iptables-init command and the intercept
// CNI plugin.
package intercept

import (
	"bufio"
	"net/netip"
	"strings"
)

// Mode is how inbound connections reach the proxy.
type Mode string

const (
	ModeRedirect Mode = "REDIRECT" // nat REDIRECT; the proxy reads SO_ORIGINAL_DST
	ModeTProxy   Mode = "TPROXY"   // mangle TPROXY + policy routing; the client's source stays visible
	// ModeEBPF: no netfilter rule in the pod; the node's eBPF programs
	// (ebpf/capture/capture.c) redirect at connect() and hand inbound SYNs to the
	// proxy, and answer SO_ORIGINAL_DST as REDIRECT's conntrack does.
	ModeEBPF Mode = "EBPF"
)

// Defaults, as istio-iptables has them.
const (
	DefaultProxyPort        = 15001
	DefaultInboundPort      = 15006
	DefaultTunnelPort       = 15008
	DefaultProxyUID         = 1337
	DefaultTProxyMark       = 1337
	DefaultTProxyRouteTable = 133
	DefaultProbePort        = 15002
	DNSCapturePort          = 15053
	// OutboundMark marks the proxy's own connections to the pod over lo in
	// TPROXY mode (istio's 1338), so they are told apart from the app's.
	OutboundMark = 1338
)

// Ports is a port selection: All ("*"), a list, or nothing.
type Ports struct {
	All   bool
	Ports []uint16
}

// Empty reports whether the selection selects nothing.
func (p Ports) Empty() bool { return !p.All && len(p.Ports) == 0 }

// CIDRs is an address selection: All ("*"), a list, or nothing.
type CIDRs struct {
	All      bool
	Prefixes []netip.Prefix
}

// GroupFilter selects, by the group owning the socket, whose outbound
// connections are captured (istio's ISTIO_OUTBOUND_OWNER_GROUPS and
// ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE). The zero value captures every
// group's.
type GroupFilter struct {
	// Only captures the connections of the GIDs' groups only (nobody's
	// when GIDs is empty); otherwise every group's but theirs.
	Only bool
	GIDs []uint32
}

// MaxOnlyGroups is how many groups an Only filter may name: istio-iptables'
// limit, as all of them go into one rule.
const MaxOnlyGroups = 64

// Limits of EBPF mode: how many proxy uids and gids together, and owner
// groups, a pod's settings in the eBPF maps hold (struct pod_capture).
const (
	MaxEBPFOwners = 8
	MaxEBPFGroups = 64
)

// Config is the whole interception setup of one pod.
type Config struct {
	ProxyPort          uint16   // -p: outbound capture port
	InboundCapturePort uint16   // -z
	InboundTunnelPort  uint16   // -e: never captured (0: none)
	ProxyUIDs          []uint32 // -u
	ProxyGIDs          []uint32 // -g
	Mode               Mode     // -m
	TProxyMark         uint32   // -t
	TProxyRouteTable   uint32   // -r

	InboundPorts         Ports    // -b
	InboundPortsExclude  []uint16 // -d (with -b "*")
	OutboundCIDRs        CIDRs    // -i
	OutboundCIDRsExclude []netip.Prefix
	OutboundPorts        []uint16 // -q: also captured whatever the CIDR
	OutboundPortsExclude []uint16 // -o

	KubeVirtInterfaces []string // -k
	ExcludeInterfaces  []string // -c

	RedirectDNS   bool
	CaptureAllDNS bool
	DNSServers    []netip.Addr // from the pod's resolv.conf, when not CaptureAllDNS
	DropInvalid   bool

	OutboundGroups GroupFilter  // ISTIO_OUTBOUND_OWNER_GROUPS(_EXCLUDE)
	IPv4Loopback   netip.Prefix // ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR; zero: 127.0.0.1/32
}

// Default returns istio-iptables' defaults: everything captured, REDIRECT.
func Default() Config {
	return Config{
		ProxyPort:          DefaultProxyPort,
		InboundCapturePort: DefaultInboundPort,
		InboundTunnelPort:  DefaultTunnelPort,
		ProxyUIDs:          []uint32{DefaultProxyUID},
		ProxyGIDs:          []uint32{DefaultProxyUID},
		Mode:               ModeRedirect,
		TProxyMark:         DefaultTProxyMark,
		TProxyRouteTable:   DefaultTProxyRouteTable,
		InboundPorts:       Ports{All: true},
		OutboundCIDRs:      CIDRs{All: true},
	}
}

// loopback is the destination range that counts as the pod's own loopback
// in family f: ::1/128, or IPv4Loopback (127.0.0.1/32 unless set).
func (c Config) loopback(f Family) netip.Prefix {
	switch {
	case f == V6:
		return netip.MustParsePrefix("::1/128")
	case c.IPv4Loopback.IsValid():
		return c.IPv4Loopback
	}
	return netip.MustParsePrefix("127.0.0.1/32")
}

// PassthroughSource is the source address a proxy binds when it connects to
// the app on behalf of an inbound connection (istio's 127.0.0.6 and ::6):
// such connections are never captured again.
func PassthroughSource(f Family) netip.Addr {
	if f == V6 {
		return netip.MustParseAddr("::6")
	}
	return netip.MustParseAddr("127.0.0.6")
}

// hasAddr reports whether a is of family f.
func hasAddr(f Family, a netip.Addr) bool { return a.Is4() == (f == V4) }

// prefixesOf keeps the prefixes of family f.
func prefixesOf(f Family, ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if hasAddr(f, p.Addr()) {
			out = append(out, p)
		}
	}
	return out
}

// includesLoopback reports whether an explicit include list names loopback:
// then the app's loopback traffic is captured too (istio's rule).
func (c Config) includesLoopback() bool {
	for _, p := range c.OutboundCIDRs.Prefixes {
		if p.Addr().IsLoopback() {
			return true
		}
	}
	return false
}

// ParseResolvConf returns the nameserver addresses of a resolv.conf.
func ParseResolvConf(text string) []netip.Addr {
	var out []netip.Addr
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "nameserver" {
			// A zone ("fe80::1%eth0") is dropped: rules match addresses.
			s, _, _ := strings.Cut(f[1], "%")
			if a, err := netip.ParseAddr(s); err == nil {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}
