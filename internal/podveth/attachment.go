package podveth

import (
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cniplugin"
)

// Attachment is one pod interface as the shared steps see it.
type Attachment struct {
	Args       *skel.CmdArgs
	Network    string
	IPAMType   string // "" when the plugin has no IPAM
	IPMasq     bool
	Backend    string // ipMasqBackend, "" to detect
	HostPrefix string
	MAC        net.HardwareAddr // the pod interface's MAC, nil for a random one
	Prev       *current.Result  // prevResult, may be nil
	prevErr    error
}

// NewAttachment is the shared view of one plugin call: base and common are
// the decoded config's shared parts, r what common.Validate derived.
func NewAttachment(args *skel.CmdArgs, base *cniplugin.Base, common *Common, r Resolved) *Attachment {
	prev, err := base.PrevResultCurrent()
	return &Attachment{
		Args: args, Network: base.Name, IPAMType: base.IPAM.Type, IPMasq: common.IPMasq,
		Backend: r.Backend, HostPrefix: r.Prefix, MAC: r.MAC, Prev: prev, prevErr: err,
	}
}

// ID is the attachment's identity, which names what it has on the host.
func (a *Attachment) ID() attachment.ID {
	return attachment.ID{Network: a.Network, ContainerID: a.Args.ContainerID, IfName: a.Args.IfName}
}

// HostVeth is the host end's name.
func (a *Attachment) HostVeth() string {
	return a.ID().HostVeth(a.HostPrefix)
}

// IPNets lists the addresses of ips.
func IPNets(ips []*current.IPConfig) []net.IPNet {
	out := make([]net.IPNet, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.Address)
	}
	return out
}

// DNSSet reports whether the config's dns object says anything (it then
// replaces what IPAM returned, as with the reference plugins).
func DNSSet(d types.DNS) bool {
	return d.Nameservers != nil || d.Search != nil || d.Options != nil || d.Domain != ""
}

// ContainerIndex is the index of the container interface in r, -1 if none.
func ContainerIndex(r *current.Result, ifName, netnsPath string) int {
	for i, intf := range r.Interfaces {
		if intf.Name == ifName && intf.Sandbox != "" && (netnsPath == "" || intf.Sandbox == netnsPath) {
			return i
		}
	}
	return -1
}
