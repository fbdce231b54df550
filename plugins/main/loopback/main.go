// Command loopback is meshwire's CNI plugin for the namespace's loopback
// device: it brings lo up (ADD), verifies it (CHECK) and takes it down (DEL).
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
