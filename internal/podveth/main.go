package podveth

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/cniplugin"
	"github.com/meshwire/meshwire/internal/detach"
	"github.com/meshwire/meshwire/internal/hostlocal"
	"github.com/meshwire/meshwire/internal/ipamexec"
)

// Main is the main function of the plugins built on these steps (bridge,
// veth): first the work of a detached child of the binary (announcements,
// link deletion), then meshwire's host-local linked in (IPAM runs
// in-process when the host-local on CNI_PATH is the binary built with this
// one), then the plugin.
func Main(name string, funcs skel.CNIFuncs) {
	detach.Run(Jobs)
	ipamexec.Link(hostlocal.Linked())
	cniplugin.Main(cniplugin.Spec{Name: name, Versions: version.All, Funcs: funcs})
}
