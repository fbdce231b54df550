// Command portmap is meshwire's chained CNI plugin that maps host ports to a
// container (what `docker run -p` and Kubernetes hostPort do), with the
// reference portmap plugin's config, on iptables or nftables, one atomic
// transaction per ADD and DEL.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/cniplugin"
)

func main() {
	cniplugin.Main(cniplugin.Spec{
		Name:     pluginType,
		Versions: version.All,
		Funcs:    skel.CNIFuncs{Add: cmdAdd, Check: cmdCheck, Del: cmdDel, GC: cmdGC, Status: cmdStatus},
	})
}
