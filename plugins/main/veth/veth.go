package main

import (
	"context"
	"errors"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/addressing"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/link"
	"github.com/meshwire/meshwire/internal/podveth"
)

// Indexes of the interfaces in the ADD result (as the reference ptp).
const (
	idxHost      = 0
	idxContainer = 1
)

func attachment(c *config, args *skel.CmdArgs) *podveth.Attachment {
	return podveth.NewAttachment(args, &c.Base, &c.Common, c.res)
}

func cmdAdd(args *skel.CmdArgs) (err error) {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	ctx := context.Background()
	att := attachment(conf, args)
	add, err := att.BeginAdd(ctx)
	if err != nil {
		return err
	}
	defer func() { add.End(err) }()
	ns, u, ipam := add.NS, &add.Undo, add.IPAM

	host, cont, err := att.CreateVeth(ns, conf.MTU)
	if err != nil {
		return err
	}
	hostName := host.Attrs().Name
	u.Push(func() { _, _ = link.DeleteByName(hostName) })
	_, _ = sysctl.Sysctl("net/ipv6/conf/"+hostName+"/accept_ra", "0")
	if err := netlink.LinkSetUp(host); err != nil {
		return cnierr.Internal("set %s up: %v", hostName, err)
	}

	ipamRes, err := ipam.Wait()
	if err != nil {
		return err
	}
	result := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: hostName, Mac: host.Attrs().HardwareAddr.String()},
			{Name: args.IfName, Mac: cont.Attrs().HardwareAddr.String(), Sandbox: args.Netns},
		},
		IPs: ipamRes.IPs, Routes: ipamRes.Routes, DNS: ipamRes.DNS,
	}
	for _, ipc := range result.IPs {
		ipc.Interface = current.Int(idxContainer)
	}
	croutes, err := containerRoutes(result.IPs, result.Routes, cont.Attrs().Index)
	if err != nil {
		return cnierr.Internal("%v", err)
	}
	v4, v6 := families(result.IPs)
	if err := addressing.EnableForwarding(v4, v6); err != nil {
		return cnierr.Internal("%v", err)
	}
	// Host end first: the pod's routes point at its gateway address.
	for _, a := range hostAddrs(result.IPs) {
		ad := &netlink.Addr{IPNet: &a}
		if a.IP.To4() == nil {
			ad.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(host, ad); err != nil && !errors.Is(err, unix.EEXIST) {
			return cnierr.Internal("add %s to %s: %v", a.String(), hostName, err)
		}
	}
	for _, r := range hostRoutes(result.IPs, host.Attrs().Index) {
		if err := netlink.RouteAdd(&r); err != nil && !errors.Is(err, unix.EEXIST) {
			return cnierr.Internal("route %s on %s: %v", r.Dst, hostName, err)
		}
	}
	if err := addressing.ApplySysctls(ns.Handle, addressing.PodSysctls(args.IfName, result.IPs, addressing.IfaceSysctls{})); err != nil {
		return cnierr.Internal("configure %s: %v", args.IfName, err)
	}
	if err := addressing.Configure(ns.NL, cont, result.IPs, nil, addressing.Options{SkipRoutes: true, NoPrefixRoute: true}); err != nil {
		return cnierr.Internal("configure %s: %v", args.IfName, err)
	}
	for _, r := range croutes {
		if err := ns.NL.RouteAdd(&r); err != nil && !errors.Is(err, unix.EEXIST) {
			return cnierr.Internal("route %s via %v in the pod: %v", r.Dst, r.Gw, err)
		}
	}
	var tail *os.File
	if conf.IPMasq {
		undoMasq, t, err := att.SetupMasq(ctx, podveth.IPNets(result.IPs))
		if err != nil {
			return err
		}
		u.Push(undoMasq)
		tail = t
	}
	if err := ns.StillThere(args.Netns); err != nil {
		if tail != nil {
			_ = tail.Close()
		}
		return err
	}
	ns.Announce(args.IfName, result.IPs, tail)
	if podveth.DNSSet(conf.DNS) {
		result.DNS = conf.DNS
	}
	if err := types.PrintResult(result, conf.CNIVersion); err != nil {
		return cnierr.Internal("print result: %v", err)
	}
	return nil
}

func families(ips []*current.IPConfig) (v4, v6 bool) {
	for _, ip := range ips {
		if ip.Address.IP.To4() != nil {
			v4 = true
		} else {
			v6 = true
		}
	}
	return v4, v6
}

func cmdDel(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	return attachment(conf, args).Del(context.Background(), nil)
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	att := attachment(conf, args)
	return att.Check(context.Background(), func(prev *current.Result) error { return checkOwn(context.Background(), att, prev, args) })
}

// checkOwn is the plugin's part of CHECK (IPAM checks its own meanwhile).
func checkOwn(ctx context.Context, att *podveth.Attachment, prev *current.Result, args *skel.CmdArgs) error {
	idx := podveth.ContainerIndex(prev, args.IfName, args.Netns)
	if idx < 0 {
		return cnierr.CheckFailed("prevResult has no interface %q in sandbox %s", args.IfName, args.Netns)
	}
	ns, err := podveth.OpenNS(args.Netns)
	if err != nil {
		return err
	}
	defer ns.Close()
	cont, host, err := podveth.CheckVeth(ns, prev, prev.Interfaces[idx])
	if err != nil {
		return err
	}
	ips := addressing.IPsFor(prev.IPs, idx)
	if err := addressing.Verify(ns.NL, cont, ips, prev.Routes); err != nil {
		return cnierr.CheckFailed("%v", err)
	}
	if err := checkHost(host, ips); err != nil {
		return err
	}
	return nil
}

// checkHost verifies the host end carries the gateways and routes to the pod.
func checkHost(host netlink.Link, ips []*current.IPConfig) error {
	addrs, err := netlinksafe.AddrList(host, netlink.FAMILY_ALL)
	if err != nil {
		return cnierr.CheckFailed("addresses of %s: %v", host.Attrs().Name, err)
	}
	have := map[string]bool{}
	for _, a := range addrs {
		have[a.IPNet.String()] = true
	}
	for _, a := range hostAddrs(ips) {
		if !have[a.String()] {
			return cnierr.CheckFailed("host end %s lacks gateway address %s", host.Attrs().Name, a.String())
		}
	}
	routes, err := netlinksafe.RouteList(host, netlink.FAMILY_ALL)
	if err != nil {
		return cnierr.CheckFailed("routes of %s: %v", host.Attrs().Name, err)
	}
	for _, want := range hostRoutes(ips, host.Attrs().Index) {
		found := false
		for _, r := range routes {
			if r.Dst != nil && r.Dst.String() == want.Dst.String() {
				found = true
			}
		}
		if !found {
			return cnierr.CheckFailed("host route to %s via %s is missing", want.Dst, host.Attrs().Name)
		}
	}
	return nil
}

func cmdStatus(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	return attachment(conf, args).Status(context.Background())
}

func cmdGC(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	return attachment(conf, args).GC(context.Background(), conf.ValidAttachments, nil)
}
