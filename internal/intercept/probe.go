package intercept

// Run validation's target: which outbound connections the rules of a
// Config capture, and the address a probe connects to.

import (
	"fmt"
	"net/netip"
	"slices"
)

// CapturedOutbound tells whether the rules of cfg send an application's
// (not the proxy's) TCP connection to dst:port, leaving the pod by a
// non-loopback interface, to the outbound capture port. It follows the
// order of the ISTIO_OUTPUT chain.
func (c Config) CapturedOutbound(dst netip.Addr, port uint16) bool {
	if slices.Contains(c.OutboundPortsExclude, port) || dst.IsLoopback() {
		return false
	}
	if c.RedirectDNS && port == 53 && (c.CaptureAllDNS || slices.Contains(c.DNSServers, dst)) {
		return false // to the DNS port instead
	}
	for _, p := range c.OutboundCIDRsExclude {
		if p.Contains(dst) {
			return false
		}
	}
	if slices.Contains(c.OutboundPorts, port) || c.OutboundCIDRs.All {
		return true
	}
	for _, p := range c.OutboundCIDRs.Prefixes {
		if p.Contains(dst) {
			return true
		}
	}
	return false
}

// probeCandidates are the addresses tried as run-validation targets when
// every destination is captured: documentation ranges, which no pod talks
// to (the connection never leaves the pod when the rules work).
var probeCandidates = map[Family][]netip.Addr{
	V4: {netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("198.51.100.1")},
	V6: {netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8:1::1")},
}

// ProbeTarget picks the destination run-validation connects to: an address
// of family f whose connections on port the rules capture.
func ProbeTarget(c Config, f Family, port uint16) (netip.Addr, error) {
	cands := append([]netip.Addr(nil), probeCandidates[f]...)
	for _, p := range prefixesOf(f, c.OutboundCIDRs.Prefixes) {
		a := p.Masked().Addr().Next()
		if a.IsValid() && p.Contains(a) && !a.IsLoopback() {
			cands = append([]netip.Addr{a}, cands...)
		}
	}
	for _, a := range cands {
		if c.CapturedOutbound(a, port) {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no %s destination on port %d is captured by these flags: nothing to validate with (change --iptables-probe-port)", f, port)
}
