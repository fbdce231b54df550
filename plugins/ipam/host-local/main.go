// Command host-local is meshwire's IPAM plugin: it allocates addresses from
// configured ranges and keeps them in a crash-safe store on the node. It
// accepts the reference host-local's config with the same meaning; see the
// store package for the on-disk design.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/plugin"
)

func main() {
	plugin.Main(plugin.Spec{
		Name:     pluginType,
		Versions: version.All,
		Funcs:    skel.CNIFuncs{Add: cmdAdd, Check: cmdCheck, Del: cmdDel, GC: cmdGC, Status: cmdStatus},
	})
}
