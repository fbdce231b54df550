package podveth

import (
	"context"
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/addressing"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ipamexec"
	"github.com/meshwire/meshwire/internal/ipmasq"
	"github.com/meshwire/meshwire/internal/link"
	"github.com/meshwire/meshwire/internal/netns"
)

// Check is CHECK's frame: prevResult is required; IPAM CHECK and the
// masquerade check run in the background while own (the plugin's part)
// checks links, addresses and routes.
func (a *Attachment) Check(ctx context.Context, own func(prev *current.Result) error) error {
	if a.prevErr != nil {
		return a.prevErr
	}
	if a.Prev == nil {
		return cnierr.Field("prevResult", "missing: CHECK compares the kernel with the result of ADD")
	}
	ipamDone := a.startCheckIPAM(ctx)
	masq := make(chan error, 1)
	go func() {
		masq <- cnierr.Catch(func() error {
			addrs := IPNets(addressing.IPsFor(a.Prev.IPs, ContainerIndex(a.Prev, a.Args.IfName, a.Args.Netns)))
			return a.checkMasq(ctx, addrs)
		})
	}()
	err := own(a.Prev)
	masqErr, ipamErr := <-masq, ipamDone()
	return joinErrors(err, masqErr, ipamErr)
}

// checkMasq verifies the masquerade rules of addrs are installed.
func (a *Attachment) checkMasq(ctx context.Context, addrs []net.IPNet) error {
	if !a.IPMasq || len(addrs) == 0 {
		return nil
	}
	fw, err := firewall.NewHost(ctx, a.Backend)
	if err != nil {
		return cnierr.CheckFailed("ipMasq: %v", err)
	}
	defer fw.Close()
	b := fw.Backend()
	m := a.ID()
	ok, err := ipmasq.Present(ctx, fw, m, addrs)
	if err != nil {
		return cnierr.CheckFailed("ipMasq: %v", err)
	}
	if !ok {
		name := m.MasqTag()
		if b.Kind == firewall.NFTables {
			name = m.MasqTable()
		}
		return cnierr.CheckFailed("ipMasq rules of this attachment (%s, %s) are missing", name, b)
	}
	return nil
}

// startCheckIPAM runs IPAM CHECK in the background (while the plugin checks
// its own part) and returns the function that waits for its outcome.
func (a *Attachment) startCheckIPAM(ctx context.Context) func() error {
	if a.IPAMType == "" {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		done <- cnierr.Catch(func() error { return ipamexec.Check(ctx, a.IPAMType, a.Args.StdinData) })
	}()
	return func() error { return <-done }
}

// CheckVeth verifies the container interface of prevResult (contIntf): it is
// a veth with the recorded MAC, and its host end exists and is listed in
// prevResult. It returns both ends.
func CheckVeth(ns *netns.NS, prev *current.Result, contIntf *current.Interface) (cont, host netlink.Link, err error) {
	name := contIntf.Name
	cont, err = ns.NL.LinkByName(name)
	if err != nil {
		return nil, nil, cnierr.CheckFailed("interface %q not found in %s", name, contIntf.Sandbox)
	}
	if _, ok := cont.(*netlink.Veth); !ok {
		return nil, nil, cnierr.CheckFailed("%q is a %s, not a veth", name, cont.Type())
	}
	if contIntf.Mac != "" && contIntf.Mac != cont.Attrs().HardwareAddr.String() {
		return nil, nil, cnierr.CheckFailed("%q has MAC %s, prevResult says %s", name, cont.Attrs().HardwareAddr, contIntf.Mac)
	}
	peer, err := link.HostPeerIndex(ns.NL, name)
	if err != nil {
		return nil, nil, cnierr.CheckFailed("%v", err)
	}
	host, err = netlink.LinkByIndex(peer)
	if err != nil {
		return nil, nil, cnierr.CheckFailed("host end of %q (ifindex %d) not found", name, peer)
	}
	for _, intf := range prev.Interfaces {
		if intf.Name == host.Attrs().Name && intf.Sandbox == "" {
			if intf.Mac != "" && intf.Mac != host.Attrs().HardwareAddr.String() {
				return nil, nil, cnierr.CheckFailed("host end %s has MAC %s, prevResult says %s", intf.Name, host.Attrs().HardwareAddr, intf.Mac)
			}
			return cont, host, nil
		}
	}
	return nil, nil, cnierr.CheckFailed("host end %s of %q is not in prevResult", host.Attrs().Name, name)
}
