package main

import (
	"errors"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// vlanAdd is one VLAN membership of a bridge port: pvid marks the port's
// untagged native VLAN (PVID, egress untagged); the others are tagged.
type vlanAdd struct {
	vid  uint16
	pvid bool
}

// portVlanPlan is what setPortVlans does to a new port of the bridge: remove
// del, then add add in order (a later add of the same VLAN changes its flags).
type portVlanPlan struct {
	del []uint16
	add []vlanAdd
}

// planPortVlans decides a new port's VLANs as the reference's setupVeth
// does. have are the VLANs the kernel gave the port when it joined the
// bridge (the bridge's default PVID, normally 1).
//
//   - With vlan or vlanTrunk and preserveDefaultVlan false (its default: a
//     plain JSON bool, whatever the reference's documentation says), every
//     VLAN of have is removed, whatever its id.
//   - vlan becomes the port's PVID, untagged; the trunk's VLANs are tagged.
//   - A trunk without vlan gets VLAN 1 as its PVID, untagged, even with
//     preserveDefaultVlan false: the reference's backwards compatibility.
func planPortVlans(have []uint16, vlan int, trunk []int, preserveDefault bool) portVlanPlan {
	var p portVlanPlan
	if vlan == 0 && len(trunk) == 0 {
		return p
	}
	if !preserveDefault {
		p.del = have
	}
	if vlan != 0 {
		p.add = append(p.add, vlanAdd{vid: uint16(vlan), pvid: true})
	}
	for _, v := range trunk {
		p.add = append(p.add, vlanAdd{vid: uint16(v)})
	}
	if vlan == 0 {
		p.add = append(p.add, vlanAdd{vid: 1, pvid: true})
	}
	return p
}

// setPortVlans applies planPortVlans to a new port of the bridge.
func setPortVlans(port netlink.Link, vlan int, trunk []int, preserveDefault bool) error {
	if vlan == 0 && len(trunk) == 0 {
		return nil
	}
	name := port.Attrs().Name
	var have []uint16
	if !preserveDefault {
		all, err := netlinksafe.BridgeVlanList()
		if err != nil {
			return cnierr.Internal("list the VLANs of %s: %v", name, err)
		}
		for _, v := range all[int32(port.Attrs().Index)] {
			have = append(have, v.Vid)
		}
	}
	p := planPortVlans(have, vlan, trunk, preserveDefault)
	for _, vid := range p.del {
		if err := netlink.BridgeVlanDel(port, vid, false, false, false, true); err != nil && !errors.Is(err, unix.ENOENT) {
			return cnierr.Internal("remove default VLAN %d from %s: %v", vid, name, err)
		}
	}
	for _, a := range p.add {
		if err := netlink.BridgeVlanAdd(port, a.vid, a.pvid, a.pvid, false, true); err != nil {
			what := "trunk VLAN"
			if a.pvid {
				what = "native VLAN"
			}
			return cnierr.Internal("%s %d on %s: %v", what, a.vid, name, err)
		}
	}
	return nil
}
