package main

import (
	"context"
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/addressing"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ipamexec"
	"github.com/meshwire/meshwire/internal/ipmasq"
	"github.com/meshwire/meshwire/internal/link"
)

// findInterfaces picks the bridge and the container interface out of a
// prevResult.
func findInterfaces(r *current.Result, bridge, ifName, netnsPath string) (br, cont *current.Interface, contIdx int) {
	contIdx = -1
	for i, intf := range r.Interfaces {
		switch {
		case intf.Name == bridge && intf.Sandbox == "":
			br = intf
		case intf.Name == ifName && intf.Sandbox == netnsPath:
			cont, contIdx = intf, i
		}
	}
	return br, cont, contIdx
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if conf.IPAM.Type != "" {
		if err := ipamexec.Check(ctx, conf.IPAM.Type, args.StdinData); err != nil {
			return err
		}
	}
	prev, err := conf.RequirePrevResult()
	if err != nil {
		return err
	}
	brIntf, contIntf, contIdx := findInterfaces(prev, conf.Bridge, args.IfName, args.Netns)
	if brIntf == nil {
		return cnierr.CheckFailed("prevResult has no interface for bridge %q", conf.Bridge)
	}
	if contIntf == nil {
		return cnierr.CheckFailed("prevResult has no interface %q in sandbox %s", args.IfName, args.Netns)
	}
	l, err := netlinksafe.LinkByName(conf.Bridge)
	if err != nil {
		return cnierr.CheckFailed("bridge %q not found", conf.Bridge)
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return cnierr.CheckFailed("%q is a %s, not a bridge", conf.Bridge, l.Type())
	}
	if brIntf.Mac != "" && brIntf.Mac != br.HardwareAddr.String() {
		return cnierr.CheckFailed("bridge %q has MAC %s, prevResult says %s", conf.Bridge, br.HardwareAddr, brIntf.Mac)
	}
	if (br.Promisc != 0) != conf.PromiscMode {
		return cnierr.CheckFailed("bridge %q promiscuous mode is %v, config says %v", conf.Bridge, br.Promisc != 0, conf.PromiscMode)
	}
	nsh, h, err := openNS(args.Netns)
	if err != nil {
		return err
	}
	defer nsh.Close()
	defer h.Close()
	cont, err := h.LinkByName(args.IfName)
	if err != nil {
		return cnierr.CheckFailed("interface %q not found in %s", args.IfName, args.Netns)
	}
	if _, ok := cont.(*netlink.Veth); !ok {
		return cnierr.CheckFailed("%q is a %s, not a veth", args.IfName, cont.Type())
	}
	if contIntf.Mac != "" && contIntf.Mac != cont.Attrs().HardwareAddr.String() {
		return cnierr.CheckFailed("%q has MAC %s, prevResult says %s", args.IfName, cont.Attrs().HardwareAddr, contIntf.Mac)
	}
	peer, err := link.HostPeerIndex(h, args.IfName)
	if err != nil {
		return cnierr.CheckFailed("%v", err)
	}
	host, err := netlink.LinkByIndex(peer)
	if err != nil {
		return cnierr.CheckFailed("host end of %q (ifindex %d) not found", args.IfName, peer)
	}
	if host.Attrs().MasterIndex != br.Index {
		return cnierr.CheckFailed("host end %s of %q is not a port of bridge %q", host.Attrs().Name, args.IfName, conf.Bridge)
	}
	inResult := false
	for _, intf := range prev.Interfaces {
		if intf.Name == host.Attrs().Name && intf.Sandbox == "" {
			inResult = true
		}
	}
	if !inResult {
		return cnierr.CheckFailed("host end %s of %q is not in prevResult", host.Attrs().Name, args.IfName)
	}
	ips := addressing.IPsFor(prev.IPs, contIdx)
	if err := addressing.Verify(h, cont, ips, prev.Routes); err != nil {
		return cnierr.CheckFailed("%v", err)
	}
	if conf.IPMasq && len(ips) > 0 {
		if err := checkMasq(ctx, conf, ipmasq.Attachment{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName}, ipNets(ips)); err != nil {
			return err
		}
	}
	return nil
}

// checkMasq verifies the attachment's masquerade rules are installed.
func checkMasq(ctx context.Context, conf *config, a ipmasq.Attachment, addrs []net.IPNet) error {
	b := ipmasq.Backend(ctx, conf.masq)
	ok, err := ipmasq.Present(ctx, b, a, addrs)
	if err != nil {
		return cnierr.CheckFailed("ipMasq: %v", err)
	}
	if !ok {
		return cnierr.CheckFailed("ipMasq rules of this attachment (%s) are missing", map[bool]string{true: a.Table(), false: a.Chain()}[b.Kind == firewall.NFTables])
	}
	return nil
}
