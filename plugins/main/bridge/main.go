// Command bridge is meshwire's bridge CNI plugin: it connects a pod to a
// Linux bridge on the host through a veth pair, delegates addressing to an
// IPAM plugin, and optionally makes the bridge the pod's gateway and
// masquerades its traffic. It accepts every config of the reference bridge
// plugin, with the same meaning.
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
