package intercept

import (
	"bufio"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
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

var tproxyMarkRE = regexp.MustCompile(`(?:--tproxy-mark|meta mark set) (0x[0-9a-f]+)(?:/0xffffffff)?(?: tproxy| |$)`)

// TProxyMarks finds the marks TPROXY rules set in iptables-save output or
// an nft listing (so that cleanup finds policy routing installed with
// other flags).
func TProxyMarks(text string) []uint32 {
	var out []uint32
	for _, line := range strings.Split(text, "\n") {
		if !strings.Contains(line, "TPROXY") && !strings.Contains(line, "tproxy") {
			continue
		}
		m := tproxyMarkRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if v, err := strconv.ParseUint(m[1], 0, 32); err == nil && v != 0 && !slices.Contains(out, uint32(v)) {
			out = append(out, uint32(v))
		}
	}
	return out
}
