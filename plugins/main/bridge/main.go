// Command bridge is meshwire's bridge CNI plugin: it connects a pod to a
// Linux bridge on the host through a veth pair, delegates addressing to an
// IPAM plugin, and optionally makes the bridge the pod's gateway and
// masquerades its traffic. It accepts every config of the reference bridge
// plugin, with the same meaning.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/meshwire/meshwire/internal/podveth"
)

func main() {
	podveth.Main(pluginType, skel.CNIFuncs{Add: cmdAdd, Check: cmdCheck, Del: cmdDel, GC: cmdGC, Status: cmdStatus})
}
