package main

import (
	"context"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/addressing"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/podveth"
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
	att := attachment(conf, args)
	return att.Check(context.Background(), func(prev *current.Result) error { return checkOwn(context.Background(), conf, att, prev, args) })
}

// checkOwn is the plugin's part of CHECK (IPAM checks its own meanwhile).
func checkOwn(ctx context.Context, conf *config, att *podveth.Attachment, prev *current.Result, args *skel.CmdArgs) error {
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
	ns, err := netns.Open(args.Netns)
	if err != nil {
		return err
	}
	defer ns.Close()
	cont, host, err := podveth.CheckVeth(ns, prev, contIntf)
	if err != nil {
		return err
	}
	if host.Attrs().MasterIndex != br.Index {
		return cnierr.CheckFailed("host end %s of %q is not a port of bridge %q", host.Attrs().Name, args.IfName, conf.Bridge)
	}
	ips := addressing.IPsFor(prev.IPs, contIdx)
	if err := addressing.Verify(ns.NL, cont, ips, prev.Routes); err != nil {
		return cnierr.CheckFailed("%v", err)
	}
	return nil
}
