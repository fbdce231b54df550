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

// An ADD of the bridge and of the veth plugin runs these steps, in this
// order; each plugin's cmdAdd reads as this list, with its own work where
// the list says "the plugin's":
//
//  1. Attachment.BeginAdd: CNI_IFNAME checked, the pod's namespace opened,
//     IPAM started in the background (it needs no link). Add.End, deferred
//     right after, undoes every recorded step when a later one fails.
//  2. The plugin's host side that the pair attaches to (bridge: the bridge).
//  3. Add.CreateVeth: the pair, its host end taking no router
//     advertisements; then the plugin's settings of the host end, ending
//     with it up (bridge: a port of the bridge; veth: only up).
//  4. The plugin's own firewall rules for the pod (bridge: macspoofchk).
//  5. Add.WaitIPAM: the pod's addresses.
//  6. The plugin's host addressing, forwarding included (bridge: the gateway
//     addresses; veth: the host end's addresses and routes to the pod).
//  7. Add.ConfigurePod: the pod interface's sysctls, addresses and routes.
//  8. Add.Masquerade, when ipMasq is set.
//  9. Add.Finish: the namespace must still be there, the addresses are
//     announced, the config's dns applied and the result printed.
//
// A bridge without IPAM skips 5 to 8 and only sets the pod interface up.

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
