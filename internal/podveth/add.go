package podveth

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/addressing"
	"github.com/meshwire/meshwire/internal/announce"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ipamexec"
	"github.com/meshwire/meshwire/internal/ipmasq"
	"github.com/meshwire/meshwire/internal/link"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/undo"
)

// Plugin is what the bridge and the veth plugin each bring to the ADD that
// RunAdd runs for both: the steps where they differ.
type Plugin interface {
	// HostSide makes what the pair attaches to (bridge: the bridge; veth:
	// nothing).
	HostSide(x *Add) error
	// AttachHostEnd sets the new host end up as the plugin needs, ending
	// with it up (bridge: a port of the bridge; veth: only up), and returns
	// the result's interfaces, the pod's last.
	AttachHostEnd(x *Add, host, cont netlink.Link) ([]*current.Interface, error)
	// Firewall installs the plugin's own rules for the pod (bridge:
	// macspoofchk), pushing their removal onto x.Undo.
	Firewall(ctx context.Context, x *Add, host, cont netlink.Link) error
	// WithoutIPAM finishes the pod interface of a config without IPAM (a
	// bridge's): RunAdd then skips the addressing steps.
	WithoutIPAM(x *Add, cont netlink.Link) error
	// HostAddressing gives the host side its addresses and routes for the
	// result's IPs, forwarding included (bridge: the gateway addresses;
	// veth: the host end's addresses and routes to the pod), and says how
	// the pod interface is addressed.
	HostAddressing(x *Add, host, cont netlink.Link, result *current.Result) (PodAddressing, error)
	// Complete fills in what is known last (bridge: MACs, taken when the
	// first port joins).
	Complete(result *current.Result)
}

// PodAddressing is how ConfigurePod addresses the pod interface.
type PodAddressing struct {
	Routes  []*types.Route
	Sysctls addressing.IfaceSysctls
	Options addressing.Options
	Extra   []netlink.Route // routes added after the addresses (veth: through its host end)
}

// RunAdd is the ADD of the bridge and of the veth plugin, the steps in the
// order both run them, with p's work where they differ:
//
//  1. BeginAdd: CNI_IFNAME checked, the pod's namespace opened, IPAM
//     started in the background (it needs no link); End, deferred, undoes
//     every recorded step when a later one fails.
//  2. p.HostSide.
//  3. CreateVeth: the pair, its host end taking no router advertisements;
//     then p.AttachHostEnd.
//  4. p.Firewall.
//  5. WaitIPAM: the pod's addresses (without IPAM: p.WithoutIPAM, and on
//     to 9).
//  6. p.HostAddressing.
//  7. ConfigurePod: the pod interface's sysctls, addresses and routes.
//  8. Masquerade, when ipMasq is set.
//  9. p.Complete, then Finish: the namespace must still be there, the
//     addresses are announced, the config's dns applied and the result
//     printed in cniVersion.
func (a *Attachment) RunAdd(ctx context.Context, p Plugin, mtu int, dns types.DNS, cniVersion string) (err error) {
	x, err := a.BeginAdd(ctx)
	if err != nil {
		return err
	}
	defer func() { x.End(err) }()
	if err := p.HostSide(x); err != nil {
		return err
	}
	host, cont, err := x.CreateVeth(mtu)
	if err != nil {
		return err
	}
	ifaces, err := p.AttachHostEnd(x, host, cont)
	if err != nil {
		return err
	}
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion, Interfaces: ifaces}
	if err := p.Firewall(ctx, x, host, cont); err != nil {
		return err
	}
	if x.IPAM == nil {
		if err := p.WithoutIPAM(x, cont); err != nil {
			return err
		}
	} else {
		ipamRes, err := x.WaitIPAM()
		if err != nil {
			return err
		}
		result.IPs, result.Routes, result.DNS = ipamRes.IPs, ipamRes.Routes, ipamRes.DNS
		pa, err := p.HostAddressing(x, host, cont, result)
		if err != nil {
			return err
		}
		if err := x.ConfigurePod(cont, result.IPs, pa.Routes, pa.Sysctls, pa.Options, pa.Extra...); err != nil {
			return err
		}
		if err := x.Masquerade(ctx, result.IPs); err != nil {
			return err
		}
	}
	p.Complete(result)
	return x.Finish(result, dns, cniVersion)
}

// Add is an ADD in progress: the pod's namespace, what to undo if ADD fails,
// and the IPAM call running in the background (nil without IPAM).
type Add struct {
	NS    *netns.NS
	Undo  undo.Stack
	IPAM  *ipamexec.Pending
	Steps *Steps

	att  *Attachment
	tail *os.File // the masquerade's, handed to the announcement
}

// BeginAdd checks CNI_IFNAME, opens the namespace and starts IPAM (which
// does not depend on the links, so it runs while they are built).
func (a *Attachment) BeginAdd(ctx context.Context) (*Add, error) {
	steps := newSteps()
	if err := link.ValidIfName(a.Args.IfName); err != nil {
		return nil, cnierr.InvalidEnv("CNI_IFNAME", "%v", err)
	}
	ns, err := netns.Open(a.Args.Netns)
	if err != nil {
		return nil, err
	}
	add := &Add{NS: ns, Steps: steps, att: a}
	if a.IPAMType != "" {
		add.IPAM = ipamexec.Start(ctx, a.IPAMType, a.Args.StdinData)
		add.Undo.Push(add.IPAM.Release)
	}
	steps.Mark("start")
	return add, nil
}

// End finishes the ADD: when it failed (err != nil) everything recorded is
// undone, IPAM included; the namespace is closed either way.
func (x *Add) End(err error) {
	if err != nil {
		if x.tail != nil {
			_ = x.tail.Close()
		}
		x.Undo.Run()
	}
	x.NS.Close()
}

// CreateVeth makes the attachment's veth pair, replacing a host end left by
// an earlier ADD of the same attachment (its name says it is ours), and
// records its removal for a failed ADD. As with the reference plugins, the
// host end takes no router advertisements. A CNI_IFNAME already present in
// the namespace is code 4.
func (x *Add) CreateVeth(mtu int) (host, cont netlink.Link, err error) {
	a, ns := x.att, x.NS
	p := link.Pair{HostName: a.HostVeth(), PeerName: a.Args.IfName, MTU: mtu, PeerMAC: a.MAC, NS: ns.FD}
	host, err = link.Create(p)
	if errors.Is(err, link.ErrExists) {
		if _, e := ns.NL.LinkByName(a.Args.IfName); e == nil {
			return nil, nil, cnierr.InvalidEnv("CNI_IFNAME", "%q already exists in the namespace", a.Args.IfName)
		}
		if _, e := link.DeleteByName(p.HostName); e != nil {
			return nil, nil, cnierr.Internal("remove stale %s: %v", p.HostName, e)
		}
		host, err = link.Create(p)
	}
	if err != nil {
		return nil, nil, cnierr.Internal("%v", err)
	}
	cont, err = ns.NL.LinkByName(a.Args.IfName)
	if err != nil {
		_, _ = link.DeleteByName(p.HostName)
		return nil, nil, cnierr.Internal("find %s in the namespace: %v", a.Args.IfName, err)
	}
	hostName := host.Attrs().Name
	x.Undo.Push(func() { _, _ = link.DeleteByName(hostName) })
	_, _ = sysctl.Sysctl("net/ipv6/conf/"+hostName+"/accept_ra", "0")
	x.Steps.Mark("veth")
	return host, cont, nil
}

// WaitIPAM waits for the IPAM call started by BeginAdd.
func (x *Add) WaitIPAM() (*current.Result, error) {
	r, err := x.IPAM.Wait()
	x.Steps.Mark("ipam wait")
	return r, err
}

// ConfigurePod writes the pod interface's sysctls for ips (see
// addressing.PodSysctls), then puts the addresses and routes on it (see
// addressing.Configure); extra routes follow (veth: through its host end).
func (x *Add) ConfigurePod(cont netlink.Link, ips []*current.IPConfig, routes []*types.Route, sys addressing.IfaceSysctls, opt addressing.Options, extra ...netlink.Route) error {
	ifName := x.att.Args.IfName
	if err := addressing.ApplySysctls(x.NS.FD, addressing.PodSysctls(ifName, ips, sys)); err != nil {
		return cnierr.Internal("configure %s: %v", ifName, err)
	}
	if err := addressing.Configure(x.NS.NL, cont, ips, routes, opt); err != nil {
		return cnierr.Internal("configure %s: %v", ifName, err)
	}
	for _, r := range extra {
		if err := x.NS.NL.RouteAdd(&r); err != nil && !errors.Is(err, unix.EEXIST) {
			return cnierr.Internal("route %s via %v in the pod: %v", r.Dst, r.Gw, err)
		}
	}
	x.Steps.Mark("addresses")
	return nil
}

// Masquerade installs the masquerading of ips when ipMasq is set, and
// records its removal for a failed ADD.
func (x *Add) Masquerade(ctx context.Context, ips []*current.IPConfig) error {
	if !x.att.IPMasq {
		return nil
	}
	undoMasq, tail, err := x.att.setupMasq(ctx, IPNets(ips))
	if err != nil {
		return err
	}
	x.Undo.Push(undoMasq)
	x.tail = tail
	x.Steps.Mark("masquerade")
	return nil
}

// Finish ends a successful ADD: the namespace must still be the one opened
// (it was not deleted meanwhile), the result's addresses are announced from
// inside it, the config's dns, when set, replaces IPAM's, and the result is
// printed in cniVersion.
func (x *Add) Finish(result *current.Result, dns types.DNS, cniVersion string) error {
	if err := x.NS.StillThere(x.att.Args.Netns); err != nil {
		return err
	}
	tail := x.tail
	x.tail = nil
	x.announce(result.IPs, tail)
	x.Steps.Mark("announce")
	if DNSSet(dns) {
		result.DNS = dns
	}
	if err := types.PrintResult(result, cniVersion); err != nil {
		return cnierr.Internal("print result: %v", err)
	}
	return nil
}

// announce sends gratuitous ARP / unsolicited NA for ips from inside the
// namespace, from a detached helper process (see announce.Start), which also
// carries tail (closed here when no helper starts). A failure is logged: the
// pod works, neighbours learn a little later.
func (x *Add) announce(ips []*current.IPConfig, tail *os.File) {
	var addrs []net.IP
	for _, ip := range ips {
		addrs = append(addrs, ip.Address.IP)
	}
	var keep []*os.File
	if tail != nil {
		keep = append(keep, tail)
	}
	if err := announce.Start(int(x.NS.FD), x.att.Args.IfName, addrs, keep...); err != nil {
		slog.Warn("announcing addresses failed", "error", err)
	}
	for _, f := range keep {
		_ = f.Close()
	}
}

// setupMasq installs masquerading of addrs; the returned func undoes it, and
// the file, when not nil, is a tail for the announcement to hand over (see
// ipmasq.Setup).
func (a *Attachment) setupMasq(ctx context.Context, addrs []net.IPNet) (func(), *os.File, error) {
	fw, err := firewall.NewHost(ctx, a.Backend)
	if err != nil {
		return nil, nil, cnierr.Wrap(err, "ipMasq")
	}
	m := a.ID()
	if err := ipmasq.Setup(ctx, fw, m, addrs); err != nil {
		fw.Close()
		return nil, nil, cnierr.Wrap(err, "ipMasq")
	}
	return func() {
		fw := firewall.New(fw.Backend())
		_ = ipmasq.Teardown(ctx, fw, m, addrs)
		fw.Close()
	}, fw.Release(), nil
}
