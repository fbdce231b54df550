package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/addressing"
	attid "github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/link"
	"github.com/meshwire/meshwire/internal/podveth"
)

// Indexes of the interfaces in the ADD result.
const (
	idxBridge    = 0
	idxHost      = 1
	idxContainer = 2
)

// attachment is the shared view of this call.
func attachment(c *config, args *skel.CmdArgs) *podveth.Attachment {
	return podveth.NewAttachment(args, &c.Base, &c.Common, c.res)
}

// cmdAdd runs the ADD bridge and veth share (podveth.RunAdd) with the
// bridge's steps.
func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	return attachment(conf, args).RunAdd(context.Background(), &bridgeAdd{conf: conf, args: args}, conf.MTU, conf.DNS, conf.CNIVersion)
}

// bridgeAdd is the bridge's part of an ADD (podveth.Plugin).
type bridgeAdd struct {
	conf *config
	args *skel.CmdArgs
	br   *netlink.Bridge
}

func (b *bridgeAdd) HostSide(x *podveth.Add) (err error) {
	if b.br, err = ensureBridge(b.conf); err != nil {
		return err
	}
	x.Steps.Mark("bridge")
	return nil
}

func (b *bridgeAdd) AttachHostEnd(x *podveth.Add, host, cont netlink.Link) ([]*current.Interface, error) {
	if err := attachPort(b.conf, b.br, host); err != nil {
		return nil, err
	}
	x.Steps.Mark("port")
	return []*current.Interface{
		{Name: b.br.Attrs().Name},
		{Name: host.Attrs().Name},
		{Name: b.args.IfName, Mac: cont.Attrs().HardwareAddr.String(), Sandbox: b.args.Netns},
	}, nil
}

func (b *bridgeAdd) Firewall(ctx context.Context, x *podveth.Add, host, cont netlink.Link) error {
	if !b.conf.MacSpoofChk {
		return nil
	}
	if err := macSpoofSetup(ctx, b.conf, b.args, host.Attrs().Name, cont.Attrs().HardwareAddr); err != nil {
		return err
	}
	x.Undo.Push(func() {
		if tail, _ := macSpoofTeardown(b.conf, b.args); tail != nil {
			_ = tail.Close()
		}
	})
	return nil
}

func (b *bridgeAdd) WithoutIPAM(x *podveth.Add, cont netlink.Link) error {
	if b.conf.DisableContainerInterface {
		return nil
	}
	if err := x.NS.NL.LinkSetUp(cont); err != nil {
		return cnierr.Internal("set %s up: %v", b.args.IfName, err)
	}
	return nil
}

func (b *bridgeAdd) HostAddressing(x *podveth.Add, host, cont netlink.Link, result *current.Result) (podveth.PodAddressing, error) {
	conf := b.conf
	gws := planGateways(result, conf.IsGateway, conf.IsDefaultGateway, idxContainer)
	if conf.IsGateway {
		if err := setupGateways(conf, b.br, gws, result); err != nil {
			return podveth.PodAddressing{}, err
		}
	}
	return podveth.PodAddressing{
		Routes:  result.Routes,
		Sysctls: addressing.IfaceSysctls{SetDAD: true, DAD: conf.EnableDAD, ArpNotify: true},
		Options: addressing.Options{DAD: conf.EnableDAD},
	}, nil
}

// Complete takes the MACs last: the bridge takes one when its first port
// joins.
func (b *bridgeAdd) Complete(result *current.Result) {
	if l, err := netlinksafe.LinkByName(result.Interfaces[idxHost].Name); err == nil {
		result.Interfaces[idxHost].Mac = l.Attrs().HardwareAddr.String()
	}
	if l, err := netlinksafe.LinkByName(b.conf.Bridge); err == nil {
		result.Interfaces[idxBridge].Mac = l.Attrs().HardwareAddr.String()
	}
}

// setupGateways puts the gateway addresses on the bridge, or on the VLAN's
// gateway interface (which then joins the result), and turns forwarding on.
func setupGateways(conf *config, br *netlink.Bridge, gws gateways, result *current.Result) error {
	gwLink := netlink.Link(br)
	if conf.Vlan != 0 && len(gws.v4)+len(gws.v6) > 0 {
		vl, err := ensureVlanGateway(conf, br)
		if err != nil {
			return err
		}
		gwLink = vl
		result.Interfaces = append(result.Interfaces, &current.Interface{Name: vl.Attrs().Name, Mac: vl.Attrs().HardwareAddr.String()})
	}
	added := false
	for _, gw := range append(gws.v4, gws.v6...) {
		a, err := ensureAddr(gwLink, gw, conf.ForceAddress)
		if err != nil {
			return err
		}
		added = added || a
	}
	if added {
		// As the reference: a bridge that gets a gateway address keeps its
		// MAC from then on (the one it had before this port joined), or it
		// would take its lowest port's and change it, the pods' gateway
		// MAC, as pods come and go.
		if err := netlink.LinkSetHardwareAddr(gwLink, gwLink.Attrs().HardwareAddr); err != nil {
			return cnierr.Internal("pin the MAC of %s: %v", gwLink.Attrs().Name, err)
		}
	}
	if err := addressing.EnableForwarding(len(gws.v4) > 0, len(gws.v6) > 0); err != nil {
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
	var extra func() (*os.File, error)
	if conf.MacSpoofChk {
		extra = func() (*os.File, error) { return macSpoofTeardown(conf, args) }
	}
	return attachment(conf, args).Del(ctx, extra)
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
	ctx := context.Background()
	var extra func([]attid.ID) error
	if conf.MacSpoofChk {
		extra = func(valid []attid.ID) error { return macSpoofGC(conf.Name, valid) }
	}
	return attachment(conf, args).GC(ctx, conf.ValidAttachments, extra)
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
			if c.vlanFiltering() && errors.Is(err, unix.EOPNOTSUPP) {
				return nil, noVlanFiltering(c)
			}
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
	// The routes of this bridge are the plugin's: no router advertisements
	// (set on every ADD, as the reference does, also on a bridge made by
	// someone else).
	raKey := fmt.Sprintf("net/ipv6/conf/%s/accept_ra", c.Bridge)
	if v, err := sysctl.Sysctl(raKey); err == nil && strings.TrimSpace(v) != "0" {
		_, _ = sysctl.Sysctl(raKey, "0")
	}
	if created {
		// Pin the MAC, or the bridge takes its lowest port's and changes as
		// pods come and go.
		_ = netlink.LinkSetHardwareAddr(br, br.HardwareAddr)
	}
	if c.vlanFiltering() && (br.VlanFiltering == nil || !*br.VlanFiltering) {
		if err := netlink.BridgeSetVlanFiltering(br, true); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				return nil, noVlanFiltering(c)
			}
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

// ensureVlanGateway returns the bridge's gateway interface for the
// configured VLAN, "<bridge>.<vlan>": the host end of a veth pair whose other
// end is an untagged port of that VLAN. It is shared by the VLAN's pods and
// stays with the bridge.
func ensureVlanGateway(c *config, br *netlink.Bridge) (netlink.Link, error) {
	name := fmt.Sprintf("%s.%d", c.Bridge, c.Vlan)
	if l, err := netlinksafe.LinkByName(name); err == nil {
		return l, nil
	}
	// Its host end is named as a pod's would be, the bridge standing for
	// the container.
	portName := attid.ID{ContainerID: c.Bridge, IfName: name}.HostVeth(c.res.Prefix)
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
	// No router advertisements on either end (the reference sets it on the
	// port, meshwire on the gateway as well).
	for _, n := range []string{portName, name} {
		_, _ = sysctl.Sysctl(fmt.Sprintf("net/ipv6/conf/%s/accept_ra", n), "0")
	}
	for _, l := range []netlink.Link{port, gw} {
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, cnierr.Internal("set %s up: %v", l.Attrs().Name, err)
		}
	}
	return gw, nil
}

// ensureAddr puts the gateway address on the bridge (or VLAN gateway); it
// reports whether it added it.
func ensureAddr(l netlink.Link, want net.IPNet, force bool) (bool, error) {
	fam := netlink.FAMILY_V6
	if want.IP.To4() != nil {
		fam = netlink.FAMILY_V4
	}
	addrs, err := netlinksafe.AddrList(l, fam)
	if err != nil {
		return false, cnierr.Internal("list addresses of %s: %v", l.Attrs().Name, err)
	}
	for _, a := range addrs {
		switch judgeAddr(*a.IPNet, want, force) {
		case addrHave:
			return false, nil
		case addrReplace:
			if err := netlink.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return false, cnierr.Internal("remove %s from %s: %v", a.IPNet, l.Attrs().Name, err)
			}
		case addrConflict:
			return false, cnierr.Config("bridge %q already has address %s, which conflicts with gateway %s (set forceAddress to replace it)", l.Attrs().Name, a.IPNet, want.String())
		}
	}
	ad := &netlink.Addr{IPNet: &want}
	if fam == netlink.FAMILY_V6 {
		ad.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrAdd(l, ad); err != nil && !errors.Is(err, unix.EEXIST) {
		return false, cnierr.Internal("add %s to %s: %v", want.String(), l.Attrs().Name, err)
	}
	return true, nil
}

// noVlanFiltering is the error for vlan/vlanTrunk on a kernel built without
// bridge VLAN filtering.
func noVlanFiltering(c *config) error {
	field := "vlan"
	if c.Vlan == 0 {
		field = "vlanTrunk"
	}
	return cnierr.Field(field, "this kernel has no bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING), which VLANs on bridge %q need", c.Bridge)
}
