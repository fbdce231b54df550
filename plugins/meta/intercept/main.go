// Command intercept is meshwire's interception CNI plugin, chained after an
// interface plugin. At pod network setup it installs, in the pod's
// namespace, the same rules iptables-init installs (so no privileged init
// container is needed), from a config whose keys are iptables-init's flag
// names with the same meaning and defaults. DEL removes them.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/cniplugin"
)

func main() {
	cniplugin.Main(cniplugin.Spec{
		Name:     pluginType,
		Versions: version.VersionsStartingFrom("0.3.0"),
		Funcs:    skel.CNIFuncs{Add: cmdAdd, Check: cmdCheck, Del: cmdDel, GC: cmdGC, Status: cmdStatus},
	})
}
