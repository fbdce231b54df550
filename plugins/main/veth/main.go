// Command veth is meshwire's point-to-point CNI plugin, config-compatible
// with the reference "ptp": a veth pair whose host end is the pod's routed
// gateway (a /32 or /128 address, no bridge), addressing delegated to an
// IPAM plugin, optional masquerade.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/meshwire/meshwire/internal/podveth"
)

func main() {
	podveth.Main(pluginType, skel.CNIFuncs{Add: cmdAdd, Check: cmdCheck, Del: cmdDel, GC: cmdGC, Status: cmdStatus})
}
