package main

import (
	"context"
	"errors"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/addressing"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/netns"
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

// cmdAdd runs the ADD bridge and veth share (podveth.RunAdd) with the veth
// plugin's steps.
func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	return attachment(conf, args).RunAdd(context.Background(), &vethAdd{args: args}, conf.MTU, conf.DNS, conf.CNIVersion)
}

// vethAdd is the veth plugin's part of an ADD (podveth.Plugin): no host
// side to attach to, the host end routed to the pod.
type vethAdd struct{ args *skel.CmdArgs }

func (vethAdd) HostSide(*podveth.Add) error { return nil }

func (v vethAdd) AttachHostEnd(_ *podveth.Add, host, cont netlink.Link) ([]*current.Interface, error) {
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, cnierr.Internal("set %s up: %v", host.Attrs().Name, err)
	}
	return []*current.Interface{
		{Name: host.Attrs().Name, Mac: host.Attrs().HardwareAddr.String()},
		{Name: v.args.IfName, Mac: cont.Attrs().HardwareAddr.String(), Sandbox: v.args.Netns},
	}, nil
}

func (vethAdd) Firewall(context.Context, *podveth.Add, netlink.Link, netlink.Link) error { return nil }

// WithoutIPAM cannot happen: the config requires ipam.
func (vethAdd) WithoutIPAM(*podveth.Add, netlink.Link) error {
	return cnierr.Field("ipam.type", "missing: the veth plugin needs an IPAM plugin for the pod's addresses")
}

// HostAddressing gives the host end the pod's gateway addresses and routes
// to the pod (first: the pod's routes point at its gateway address); the
// pod's routes go through the host end, without prefix routes.
func (vethAdd) HostAddressing(_ *podveth.Add, host, cont netlink.Link, result *current.Result) (podveth.PodAddressing, error) {
	for _, ipc := range result.IPs {
		ipc.Interface = current.Int(idxContainer)
	}
	croutes, err := containerRoutes(result.IPs, result.Routes, cont.Attrs().Index)
	if err != nil {
		return podveth.PodAddressing{}, cnierr.Internal("%v", err)
	}
	if err := setupHost(host, result.IPs); err != nil {
		return podveth.PodAddressing{}, err
	}
	return podveth.PodAddressing{Options: addressing.Options{SkipRoutes: true, NoPrefixRoute: true}, Extra: croutes}, nil
}

func (vethAdd) Complete(*current.Result) {}

// setupHost turns forwarding on and gives the host end the pod's gateway
// addresses and the routes to the pod.
func setupHost(host netlink.Link, ips []*current.IPConfig) error {
	hostName := host.Attrs().Name
	v4, v6 := families(ips)
	if err := addressing.EnableForwarding(v4, v6); err != nil {
		return cnierr.Internal("%v", err)
	}
	for _, a := range hostAddrs(ips) {
		ad := &netlink.Addr{IPNet: &a}
		if a.IP.To4() == nil {
			ad.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(host, ad); err != nil && !errors.Is(err, unix.EEXIST) {
			return cnierr.Internal("add %s to %s: %v", a.String(), hostName, err)
		}
	}
	for _, r := range hostRoutes(ips, host.Attrs().Index) {
		if err := netlink.RouteAdd(&r); err != nil && !errors.Is(err, unix.EEXIST) {
			return cnierr.Internal("route %s on %s: %v", r.Dst, hostName, err)
		}
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
	ns, err := netns.Open(args.Netns)
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
