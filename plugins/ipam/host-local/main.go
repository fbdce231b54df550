// Command host-local is meshwire's IPAM plugin: it allocates addresses from
// configured ranges and keeps them in a crash-safe store on the node. It
// accepts the reference host-local's config with the same meaning; the
// allocation and the store are in internal/hostlocal.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/cniplugin"
	"github.com/meshwire/meshwire/internal/hostlocal"
)

func main() {
	cniplugin.Main(cniplugin.Spec{
		Name:     hostlocal.Type,
		Versions: version.All,
		Funcs:    skel.CNIFuncs{Add: add, Check: hostlocal.Check, Del: hostlocal.Del, GC: hostlocal.GC, Status: hostlocal.Status},
	})
}

func add(args *skel.CmdArgs) error {
	r, cniVersion, err := hostlocal.Add(args)
	if err != nil {
		return err
	}
	return types.PrintResult(r, cniVersion)
}
