package main

import (
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/addressing"
)

// hostMask is the full-length mask of ip's family.
func hostMask(ip net.IP) net.IPMask {
	if ip.To4() != nil {
		return net.CIDRMask(32, 32)
	}
	return net.CIDRMask(128, 128)
}

// containerRoutes is the point-to-point routing inside the pod, as the
// reference ptp plugin sets it up: the pod's address keeps its prefix length
// but no prefix route; the gateway is reached on-link as a host route, and
// the subnet and every IPAM route go through the gateway.
func containerRoutes(ips []*current.IPConfig, routes []*types.Route, linkIndex int) ([]netlink.Route, error) {
	var out []netlink.Route
	for _, ipc := range ips {
		if ipc.Gateway == nil {
			return nil, fmt.Errorf("IPAM gave %s no gateway: the veth plugin routes through one", ipc.Address.String())
		}
		gw := ipc.Gateway
		out = append(out,
			netlink.Route{LinkIndex: linkIndex, Dst: &net.IPNet{IP: gw, Mask: hostMask(gw)}, Scope: netlink.SCOPE_LINK, Src: ipc.Address.IP},
			netlink.Route{LinkIndex: linkIndex, Dst: &net.IPNet{IP: ipc.Address.IP.Mask(ipc.Address.Mask), Mask: ipc.Address.Mask}, Gw: gw, Src: ipc.Address.IP},
		)
	}
	out = append(out, addressing.Routes(ips, routes, linkIndex)...)
	return out, nil
}

// hostAddrs are the gateway addresses of the host end (one per gateway,
// full-length prefix) and hostRoutes the routes to the pod's addresses.
func hostAddrs(ips []*current.IPConfig) []net.IPNet {
	seen := map[string]bool{}
	var out []net.IPNet
	for _, ipc := range ips {
		n := net.IPNet{IP: ipc.Gateway, Mask: hostMask(ipc.Gateway)}
		if !seen[n.String()] {
			seen[n.String()] = true
			out = append(out, n)
		}
	}
	return out
}

// hostRoutes have scope host, as the reference's (ip.AddHostRoute), so
// that `ip route` shows the same on a node that ran either plugin.
func hostRoutes(ips []*current.IPConfig, linkIndex int) []netlink.Route {
	var out []netlink.Route
	for _, ipc := range ips {
		out = append(out, netlink.Route{LinkIndex: linkIndex, Dst: &net.IPNet{IP: ipc.Address.IP, Mask: hostMask(ipc.Address.IP)}, Scope: netlink.SCOPE_HOST})
	}
	return out
}
