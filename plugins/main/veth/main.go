// Command veth is meshwire's point-to-point CNI plugin, config-compatible
// with the reference "ptp": a veth pair whose host end is the pod's routed
// gateway (a /32 or /128 address, no bridge), addressing delegated to an
// IPAM plugin, optional masquerade.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/cniplugin"
	"github.com/meshwire/meshwire/internal/detach"
	"github.com/meshwire/meshwire/internal/hostlocal"
	"github.com/meshwire/meshwire/internal/ipamexec"
	"github.com/meshwire/meshwire/internal/podveth"
)

func main() {
	detach.Run(podveth.Jobs) // when started as a detached child (announcements, link deletion)
	// meshwire's host-local, compiled in: IPAM runs in-process when the
	// host-local on CNI_PATH is the binary built with this one.
	ipamexec.Link(hostlocal.Linked())
	cniplugin.Main(cniplugin.Spec{
		Name:     pluginType,
		Versions: version.All,
		Funcs:    skel.CNIFuncs{Add: cmdAdd, Check: cmdCheck, Del: cmdDel, GC: cmdGC, Status: cmdStatus},
	})
}
