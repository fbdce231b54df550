package main

import (
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/meshwire/meshwire/internal/addressing"
)

// gateways is, per family, the bridge addresses to configure.
type gateways struct {
	v4, v6 []net.IPNet
}

// planGateways fills in the result's gateways and default routes the way
// the reference bridge plugin does, and returns the addresses the bridge
// needs: with isGateway, an IP config without a gateway gets the first
// address of its subnet; with isDefaultGateway, each family gets a default
// route through its gateway unless IPAM already gave one. contIdx is the
// container interface's index in result.Interfaces.
func planGateways(res *current.Result, isGW, isDefaultGW bool, contIdx int) gateways {
	var g gateways
	seenDefault := map[bool]bool{}
	for _, ipc := range res.IPs {
		v4 := ipc.Address.IP.To4() != nil
		ipc.Interface = current.Int(contIdx)
		if ipc.Gateway == nil && isGW {
			ipc.Gateway = addressing.NextIP(ipc.Address.IP.Mask(ipc.Address.Mask))
		}
		if isDefaultGW && !seenDefault[v4] {
			def := net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
			if v4 {
				def = net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
			}
			found := false
			for _, r := range res.Routes {
				if r.GW != nil && r.Dst.String() == def.String() {
					found = true
					break
				}
			}
			if !found {
				res.Routes = append(res.Routes, &types.Route{Dst: def, GW: ipc.Gateway})
			}
			seenDefault[v4] = true
		}
		if isGW && ipc.Gateway != nil {
			gw := net.IPNet{IP: ipc.Gateway, Mask: ipc.Address.Mask}
			if v4 {
				gw.IP = gw.IP.To4()
				g.v4 = append(g.v4, gw)
			} else {
				g.v6 = append(g.v6, gw)
			}
		}
	}
	return g
}

// addrAction is what ensureAddr must do about one existing bridge address.
type addrAction int

const (
	addrKeep     addrAction = iota // unrelated: leave it
	addrHave                       // already the wanted address
	addrReplace                    // conflicting, forceAddress: remove it
	addrConflict                   // conflicting: fail
)

// judgeAddr decides about an existing bridge address when want is to be
// added: IPv4 allows one address per bridge (as the reference), IPv6 several
// unless their subnets overlap.
func judgeAddr(existing, want net.IPNet, force bool) addrAction {
	if existing.String() == want.String() {
		return addrHave
	}
	v4 := want.IP.To4() != nil
	if (existing.IP.To4() != nil) != v4 {
		return addrKeep
	}
	if v4 || existing.Contains(want.IP) || want.Contains(existing.IP) {
		if existing.IP.IsLinkLocalUnicast() && !v4 {
			return addrKeep
		}
		if force {
			return addrReplace
		}
		return addrConflict
	}
	return addrKeep
}
