package main

import (
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/link"
)

// findHostVeth returns the host end of the pod's veth CNI_IFNAME, with
// prevResult's host interfaces as hints (see link.FindHostVeth).
func findHostVeth(nsPath, ifName string, prev *current.Result) (netlink.Link, error) {
	return link.FindHostVeth(nsPath, ifName, link.HostInterfaceNames(prev)...)
}
