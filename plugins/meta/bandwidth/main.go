// Command bandwidth is meshwire's traffic-shaping CNI plugin, chained after
// an interface plugin: it limits what the pod receives with a token bucket
// (tbf) on the host end of its veth, and what it sends by redirecting the
// host end's ingress to an ifb device shaped the same way. Its config is the
// reference plugin's: ingressRate/ingressBurst/egressRate/egressBurst in bits
// per second and bits, or the runtime's "bandwidth" capability.
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
