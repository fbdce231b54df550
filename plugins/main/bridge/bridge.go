package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/addressing"
	"github.com/meshwire/meshwire/internal/announce"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/ipamexec"
	"github.com/meshwire/meshwire/internal/ipmasq"
	"github.com/meshwire/meshwire/internal/link"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/undo"
)

// Indexes of the interfaces in the ADD result.
const (
	idxBridge    = 0
	idxHost      = 1
	idxContainer = 2
)

func attachment(c *config, args *skel.CmdArgs) ipmasq.Attachment {
	return ipmasq.Attachment{Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName}
}

func openNS(path string) (vnetns.NsHandle, *netlink.Handle, error) {
	if path == "" {
		return 0, nil, cnierr.InvalidEnv("CNI_NETNS", "not set")
	}
	nsh, err := vnetns.GetFromPath(path)
	if err != nil {
		return 0, nil, errors.Join(cnierr.InvalidEnv("CNI_NETNS", "%v", err), &netns.Gone{Err: err})
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(nsh), &st); err != nil || (st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC) {
		nsh.Close()
		e := fmt.Errorf("%s is not a network namespace", path)
		return 0, nil, errors.Join(cnierr.InvalidEnv("CNI_NETNS", "%v", e), &netns.Gone{Err: e})
	}
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		nsh.Close()
		return 0, nil, errors.Join(cnierr.InvalidEnv("CNI_NETNS", "%v", err), &netns.Gone{Err: err})
	}
	return nsh, h, nil
}

func cmdAdd(args *skel.CmdArgs) (err error) {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	if err := link.ValidIfName(args.IfName); err != nil {
		return cnierr.InvalidEnv("CNI_IFNAME", "%v", err)
	}
	nsh, h, err := openNS(args.Netns)
	if err != nil {
		return err
	}
	defer nsh.Close()
	defer h.Close()
	ctx := context.Background()

	var u undo.Stack
	defer func() {
		if err != nil {
			u.Run()
		}
	}()
	var ipam *ipamexec.Pending
	if conf.IPAM.Type != "" {
		// IPAM does not depend on the links: run it while they are built.
		ipam = ipamexec.Start(ctx, conf.IPAM.Type, args.StdinData)
		u.Push(ipam.Release)
	}

	br, err := ensureBridge(conf)
	if err != nil {
		return err
	}
	hostName := link.HostVethName(conf.pfx, args.ContainerID, args.IfName)
	host, err := createVeth(conf, hostName, args.IfName, nsh, h)
	if err != nil {
		return err
	}
	u.Push(func() { _, _ = link.DeleteByName(hostName) })
	if err := attachPort(conf, br, host); err != nil {
		return err
	}
	cont, err := h.LinkByName(args.IfName)
	if err != nil {
		return cnierr.Internal("find %s in the namespace: %v", args.IfName, err)
	}

	result := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: br.Attrs().Name},
			{Name: hostName},
			{Name: args.IfName, Mac: cont.Attrs().HardwareAddr.String(), Sandbox: args.Netns},
		},
	}

	if conf.MacSpoofChk {
		if err := macSpoofSetup(ctx, conf, args, hostName, cont.Attrs().HardwareAddr); err != nil {
			return err
		}
		u.Push(func() { _ = macSpoofTeardown(ctx, conf, args) })
	}

	if ipam != nil {
		ipamRes, err := ipam.Wait()
		if err != nil {
			return err
		}
		result.IPs, result.Routes, result.DNS = ipamRes.IPs, ipamRes.Routes, ipamRes.DNS
		gws := planGateways(result, conf.IsGateway, conf.IsDefaultGateway, idxContainer)
		if err := addressing.Configure(h, cont, result.IPs, result.Routes, addressing.Options{DAD: conf.EnableDAD}); err != nil {
			return cnierr.Internal("configure %s: %v", args.IfName, err)
		}
		if conf.IsGateway {
			gwLink := netlink.Link(br)
			if conf.Vlan != 0 && len(gws.v4)+len(gws.v6) > 0 {
				vl, err := ensureVlanGateway(conf, br)
				if err != nil {
					return err
				}
				gwLink = vl
				result.Interfaces = append(result.Interfaces, &current.Interface{Name: vl.Attrs().Name, Mac: vl.Attrs().HardwareAddr.String()})
			}
			for _, gw := range append(gws.v4, gws.v6...) {
				if err := ensureAddr(gwLink, gw, conf.ForceAddress); err != nil {
					return err
				}
			}
			if err := enableForwarding(len(gws.v4) > 0, len(gws.v6) > 0); err != nil {
				return err
			}
		}
		if conf.IPMasq {
			a := attachment(conf, args)
			b := ipmasq.Backend(ctx, conf.masq)
			addrs := ipNets(result.IPs)
			if err := ipmasq.Setup(ctx, b, a, addrs); err != nil {
				return cnierr.Wrap(err, "ipMasq")
			}
			u.Push(func() { _ = ipmasq.Teardown(ctx, b, a, addrs) })
		}
		announceAddrs(args.Netns, args.IfName, result.IPs)
	} else if !conf.DisableContainerInterface {
		if err := h.LinkSetUp(cont); err != nil {
			return cnierr.Internal("set %s up: %v", args.IfName, err)
		}
	}

	// MACs last: the bridge takes one when its first port joins.
	if l, err := netlinksafe.LinkByName(hostName); err == nil {
		result.Interfaces[idxHost].Mac = l.Attrs().HardwareAddr.String()
	}
	if l, err := netlinksafe.LinkByName(conf.Bridge); err == nil {
		result.Interfaces[idxBridge].Mac = l.Attrs().HardwareAddr.String()
	}
	if dnsSet(conf.DNS) {
		result.DNS = conf.DNS
	}
	if err := types.PrintResult(result, conf.CNIVersion); err != nil {
		return cnierr.Internal("print result: %v", err)
	}
	u.Forget()
	return nil
}

func dnsSet(d types.DNS) bool {
	return d.Nameservers != nil || d.Search != nil || d.Options != nil || d.Domain != ""
}

func ipNets(ips []*current.IPConfig) []net.IPNet {
	out := make([]net.IPNet, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.Address)
	}
	return out
}

// announceAddrs sends gratuitous ARP / unsolicited NA from inside the
// namespace. A failure is logged: the pod works, neighbours learn later.
func announceAddrs(nsPath, ifName string, ips []*current.IPConfig) {
	var addrs []net.IP
	for _, ip := range ips {
		addrs = append(addrs, ip.Address.IP)
	}
	err := netns.Enter(nsPath, func() error { return announce.Addresses(ifName, addrs) })
	if err != nil {
		slog.Warn("announcing addresses failed", "error", err)
	}
}

// ensureBridge creates the bridge or reuses it. Concurrent ADDs on a new
// node race here: the loser of LinkAdd gets EEXIST and uses the winner's.
func ensureBridge(c *config) (*netlink.Bridge, error) {
	l, err := netlinksafe.LinkByName(c.Bridge)
	created := false
	if err != nil {
		if !link.IsNotFound(err) {
			return nil, cnierr.Internal("look up bridge %q: %v", c.Bridge, err)
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = c.Bridge
		attrs.MTU = c.MTU
		nb := &netlink.Bridge{LinkAttrs: attrs}
		if c.vlanFiltering() {
			t := true
			nb.VlanFiltering = &t
		}
		if err := netlink.LinkAdd(nb); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, cnierr.Internal("create bridge %q: %v", c.Bridge, err)
		} else if err == nil {
			created = true
		}
		if l, err = netlinksafe.LinkByName(c.Bridge); err != nil {
			return nil, cnierr.Internal("look up bridge %q: %v", c.Bridge, err)
		}
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return nil, cnierr.Field("bridge", "%q exists and is a %s, not a bridge", c.Bridge, l.Type())
	}
	if created {
		// The routes of this bridge are the plugin's: no router advertisements.
		_, _ = sysctl.Sysctl(fmt.Sprintf("net/ipv6/conf/%s/accept_ra", c.Bridge), "0")
		// Pin the MAC, or the bridge takes its lowest port's and changes as
		// pods come and go.
		_ = netlink.LinkSetHardwareAddr(br, br.HardwareAddr)
	}
	if c.vlanFiltering() && (br.VlanFiltering == nil || !*br.VlanFiltering) {
		if err := netlink.BridgeSetVlanFiltering(br, true); err != nil {
			return nil, cnierr.Internal("enable VLAN filtering on %q: %v", c.Bridge, err)
		}
	}
	if c.PromiscMode && br.Promisc == 0 {
		if err := netlink.SetPromiscOn(br); err != nil {
			return nil, cnierr.Internal("set %q promiscuous: %v", c.Bridge, err)
		}
	}
	if br.Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(br); err != nil {
			return nil, cnierr.Internal("set bridge %q up: %v", c.Bridge, err)
		}
	}
	return br, nil
}

// createVeth makes the pair, replacing a host end left by an earlier ADD of
// the same attachment (its name says it is ours).
func createVeth(c *config, hostName, ifName string, nsh vnetns.NsHandle, h *netlink.Handle) (netlink.Link, error) {
	p := link.Pair{HostName: hostName, PeerName: ifName, MTU: c.MTU, PeerMAC: c.mac, NS: nsh}
	host, err := link.Create(p)
	if errors.Is(err, link.ErrExists) {
		if _, e := h.LinkByName(ifName); e == nil {
			return nil, cnierr.InvalidEnv("CNI_IFNAME", "%q already exists in the namespace", ifName)
		}
		if _, e := link.DeleteByName(hostName); e != nil {
			return nil, cnierr.Internal("remove stale %s: %v", hostName, e)
		}
		host, err = link.Create(p)
	}
	if err != nil {
		return nil, cnierr.Internal("%v", err)
	}
	return host, nil
}

// attachPort makes the host end a port of the bridge with the configured
// port options and brings it up.
func attachPort(c *config, br *netlink.Bridge, host netlink.Link) error {
	name := host.Attrs().Name
	if err := netlink.LinkSetMasterByIndex(host, br.Index); err != nil {
		return cnierr.Internal("attach %s to bridge %s: %v", name, br.Name, err)
	}
	if c.HairpinMode {
		if err := netlink.LinkSetHairpin(host, true); err != nil {
			return cnierr.Internal("hairpin mode on %s: %v", name, err)
		}
	}
	if c.PortIsolation {
		if err := netlink.LinkSetIsolated(host, true); err != nil {
			return cnierr.Internal("port isolation on %s: %v", name, err)
		}
	}
	if err := setPortVlans(host, c.Vlan, c.vlans, c.PreserveDefaultVlan); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return cnierr.Internal("set %s up: %v", name, err)
	}
	return nil
}

func setPortVlans(host netlink.Link, vlan int, trunk []int, preserveDefault bool) error {
	name := host.Attrs().Name
	if (vlan != 0 || len(trunk) > 0) && !preserveDefault {
		if err := netlink.BridgeVlanDel(host, 1, true, true, false, true); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return cnierr.Internal("remove default VLAN from %s: %v", name, err)
		}
	}
	if vlan != 0 {
		if err := netlink.BridgeVlanAdd(host, uint16(vlan), true, true, false, true); err != nil {
			return cnierr.Internal("VLAN %d on %s: %v", vlan, name, err)
		}
	}
	for _, v := range trunk {
		if err := netlink.BridgeVlanAdd(host, uint16(v), false, false, false, true); err != nil {
			return cnierr.Internal("trunk VLAN %d on %s: %v", v, name, err)
		}
	}
	if vlan == 0 && len(trunk) > 0 {
		// As the reference: a trunk without vlan keeps VLAN 1 native.
		if err := netlink.BridgeVlanAdd(host, 1, true, true, false, true); err != nil {
			return cnierr.Internal("native VLAN 1 on %s: %v", name, err)
		}
	}
	return nil
}

// ensureVlanGateway returns the bridge's gateway interface for the
// configured VLAN, "<bridge>.<vlan>": the host end of a veth pair whose other
// end is an untagged port of that VLAN. It is shared by the VLAN's pods and
// stays with the bridge.
func ensureVlanGateway(c *config, br *netlink.Bridge) (netlink.Link, error) {
	name := fmt.Sprintf("%s.%d", c.Bridge, c.Vlan)
	if l, err := netlinksafe.LinkByName(name); err == nil {
		return l, nil
	}
	portName := link.HostVethName(c.pfx, c.Bridge, name)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = portName
	attrs.MTU = br.MTU
	v := &netlink.Veth{LinkAttrs: attrs, PeerName: name, PeerTxQLen: -1}
	if err := netlink.LinkAdd(v); err != nil {
		if errors.Is(err, unix.EEXIST) {
			if l, err := netlinksafe.LinkByName(name); err == nil {
				return l, nil
			}
		}
		return nil, cnierr.Internal("create VLAN gateway %s: %v", name, err)
	}
	port, err := netlinksafe.LinkByName(portName)
	if err != nil {
		return nil, cnierr.Internal("find %s: %v", portName, err)
	}
	if err := netlink.LinkSetMasterByIndex(port, br.Index); err != nil {
		return nil, cnierr.Internal("attach %s to %s: %v", portName, c.Bridge, err)
	}
	if err := setPortVlans(port, c.Vlan, nil, c.PreserveDefaultVlan); err != nil {
		return nil, err
	}
	gw, err := netlinksafe.LinkByName(name)
	if err != nil {
		return nil, cnierr.Internal("find %s: %v", name, err)
	}
	_, _ = sysctl.Sysctl(fmt.Sprintf("net/ipv6/conf/%s/accept_ra", name), "0")
	for _, l := range []netlink.Link{port, gw} {
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, cnierr.Internal("set %s up: %v", l.Attrs().Name, err)
		}
	}
	return gw, nil
}

// ensureAddr puts the gateway address on the bridge (or VLAN gateway).
func ensureAddr(l netlink.Link, want net.IPNet, force bool) error {
	fam := netlink.FAMILY_V6
	if want.IP.To4() != nil {
		fam = netlink.FAMILY_V4
	}
	addrs, err := netlinksafe.AddrList(l, fam)
	if err != nil {
		return cnierr.Internal("list addresses of %s: %v", l.Attrs().Name, err)
	}
	for _, a := range addrs {
		switch judgeAddr(*a.IPNet, want, force) {
		case addrHave:
			return nil
		case addrReplace:
			if err := netlink.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return cnierr.Internal("remove %s from %s: %v", a.IPNet, l.Attrs().Name, err)
			}
		case addrConflict:
			return cnierr.Config("bridge %q already has address %s, which conflicts with gateway %s (set forceAddress to replace it)", l.Attrs().Name, a.IPNet, want.String())
		}
	}
	ad := &netlink.Addr{IPNet: &want}
	if fam == netlink.FAMILY_V6 {
		ad.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrAdd(l, ad); err != nil && !errors.Is(err, unix.EEXIST) {
		return cnierr.Internal("add %s to %s: %v", want.String(), l.Attrs().Name, err)
	}
	return nil
}

func enableForwarding(v4, v6 bool) error {
	if err := addressing.EnableForwarding(v4, v6); err != nil {
		return cnierr.Internal("%v", err)
	}
	return nil
}

func cmdDel(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	ctx := context.Background()
	prev, _ := conf.PrevResultCurrent()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	run := func(i int, fn func() error) {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn() }()
	}
	if conf.IPAM.Type != "" {
		run(0, func() error { return ipamexec.Del(ctx, conf.IPAM.Type, args.StdinData) })
	}
	run(1, func() error { return removeVeth(conf.pfx, args) })
	if conf.IPMasq {
		run(2, func() error {
			var addrs []net.IPNet
			if prev != nil {
				addrs = ipNets(addressing.IPsFor(prev.IPs, containerIndex(prev, args)))
			}
			return cnierr.Wrap(ipmasq.Teardown(ctx, ipmasq.Backend(ctx, conf.masq), attachment(conf, args), addrs), "ipMasq teardown")
		})
	}
	if conf.MacSpoofChk {
		run(3, func() error { return macSpoofTeardown(ctx, conf, args) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// containerIndex is the index of the container interface in r, -1 if none.
func containerIndex(r *current.Result, args *skel.CmdArgs) int {
	for i, intf := range r.Interfaces {
		if intf.Name == args.IfName && intf.Sandbox != "" {
			return i
		}
	}
	return -1
}

// removeVeth deletes the pod's veth pair: through the host end's name
// (no namespace needed), else through CNI_IFNAME inside the namespace when it
// still exists. Nothing there is not an error.
func removeVeth(prefix string, args *skel.CmdArgs) error {
	deleted, err := link.DeleteByName(link.HostVethName(prefix, args.ContainerID, args.IfName))
	if err != nil {
		return cnierr.Internal("%v", err)
	}
	if deleted || args.Netns == "" {
		return nil
	}
	nsh, h, err := openNS(args.Netns)
	if err != nil {
		slog.Info("namespace not usable, nothing to remove inside it", "error", err)
		return nil
	}
	defer nsh.Close()
	defer h.Close()
	l, err := h.LinkByName(args.IfName)
	if err != nil {
		return nil
	}
	if _, ok := l.(*netlink.Veth); !ok {
		return nil
	}
	if err := h.LinkDel(l); err != nil && !link.IsNotFound(err) {
		return cnierr.Internal("delete %s: %v", args.IfName, err)
	}
	return nil
}

func cmdStatus(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if conf.IPMasq {
		if err := ipmasq.Backend(ctx, conf.masq).Available(ctx); err != nil {
			return err
		}
	}
	if conf.IPAM.Type != "" {
		return ipamexec.Status(ctx, conf.IPAM.Type, args.StdinData)
	}
	return nil
}

func cmdGC(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	ctx := context.Background()
	var errs []error
	var valid []ipmasq.Attachment
	for _, v := range conf.ValidAttachments {
		valid = append(valid, ipmasq.Attachment{Network: conf.Name, ContainerID: v.ContainerID, IfName: v.IfName})
	}
	if conf.IPMasq {
		errs = append(errs, ipmasq.GC(ctx, ipmasq.Backend(ctx, conf.masq), conf.Name, valid))
	}
	if conf.MacSpoofChk {
		errs = append(errs, macSpoofGC(ctx, conf.Name, valid))
	}
	if conf.IPAM.Type != "" {
		errs = append(errs, ipamexec.GC(ctx, conf.IPAM.Type, args.StdinData))
	}
	return errors.Join(errs...)
}
