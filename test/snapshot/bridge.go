package main

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// bridgeAllowance says which differences a bridge plugin explains once
// every pod of the node is gone: the bridge name it keeps by design (the
// reference plugins and meshwire's alike), read from the live node. A node
// that never ran a pod has no bridge, and nothing is explained.
func bridgeAllowance(name string) (func(string) bool, error) {
	l, err := netlinksafe.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return func(string) bool { return false }, nil
	}
	if err != nil {
		return nil, fmt.Errorf("-bridge %s: %w", name, err)
	}
	addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("-bridge %s: its addresses: %w", name, err)
	}
	var prefixes []netip.Prefix
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		prefixes = append(prefixes, netip.PrefixFrom(ip.Unmap(), ones))
	}
	return bridgeAllows(name, l.Attrs().Index, l.Type(), prefixes), nil
}

var (
	routeIndex = regexp.MustCompile(`Ifindex: (\d+) `)
	routeDst   = regexp.MustCompile(`Dst: (\S+) `)
	// IPv6's multicast route, which the kernel gives every link with
	// IPv6 on.
	multicast6 = netip.MustParsePrefix("ff00::/8")
)

// bridgeAllows is bridgeAllowance's judgement, each difference by name:
//   - the bridge's link;
//   - each of its addresses;
//   - the routes the kernel made for them: on the bridge, to one of its
//     addresses or within one of their networks (connected, local,
//     broadcast), and IPv6's multicast route;
//   - the bridge's own per-link sysctls, and its default qdisc;
//   - forwarding turned on (ip_forward, IPv6's all/forwarding), which
//     the plugin sets for a gateway (isGateway).
//
// Nothing else: no rule, no qdisc, no file, no other link.
func bridgeAllows(name string, index int, kind string, addrs []netip.Prefix) func(string) bool {
	exact := map[string]bool{
		fmt.Sprintf("links: added %q", name+" type="+kind):                       true,
		fmt.Sprintf("qdiscs: added %q", name+" noqueue handle=none parent=root"): true,
		`sysctls: added "net/ipv4/ip_forward=1"`:                                 true,
		`sysctls: removed "net/ipv4/ip_forward=0"`:                               true,
		`sysctls: added "net/ipv6/conf/all/forwarding=1"`:                        true,
		`sysctls: removed "net/ipv6/conf/all/forwarding=0"`:                      true,
		fmt.Sprintf(`sysctls: added "net/ipv4/conf/%s/route_localnet=0"`, name):  true,
		fmt.Sprintf(`sysctls: added "net/ipv4/conf/%s/route_localnet=1"`, name):  true,
		fmt.Sprintf(`sysctls: added "net/ipv6/conf/%s/accept_ra=0"`, name):       true,
		fmt.Sprintf(`sysctls: added "net/ipv6/conf/%s/accept_ra=1"`, name):       true,
		fmt.Sprintf(`sysctls: added "net/ipv6/conf/%s/accept_ra=2"`, name):       true,
		fmt.Sprintf(`sysctls: added "net/ipv6/conf/%s/accept_dad=0"`, name):      true,
		fmt.Sprintf(`sysctls: added "net/ipv6/conf/%s/accept_dad=1"`, name):      true,
	}
	for _, a := range addrs {
		exact[fmt.Sprintf("addrs: added %q", a.String())] = true
	}
	const routeAdded = `routes: added "`
	return func(d string) bool {
		if exact[d] {
			return true
		}
		if len(d) <= len(routeAdded) || d[:len(routeAdded)] != routeAdded {
			return false
		}
		m := routeIndex.FindStringSubmatch(d)
		if m == nil || m[1] != strconv.Itoa(index) {
			return false
		}
		dm := routeDst.FindStringSubmatch(d)
		if dm == nil {
			return false
		}
		dst, err := netip.ParsePrefix(dm[1])
		if err != nil {
			return false
		}
		if dst == multicast6 {
			return true
		}
		for _, a := range addrs {
			if a.Masked().Contains(dst.Addr()) && dst.Bits() >= a.Bits() {
				return true
			}
		}
		return false
	}
}
