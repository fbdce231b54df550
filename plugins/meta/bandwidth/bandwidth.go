package main

import (
	"errors"
	"log/slog"
	"net"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/killpoint"
	"github.com/meshwire/meshwire/internal/netns"
)

// chained decodes the config of ADD and CHECK, which need prevResult.
func chained(args *skel.CmdArgs) (*config, Bandwidth, *current.Result, error) {
	conf, bw, err := parseConfig(args.StdinData)
	if err != nil {
		return nil, bw, nil, err
	}
	prev, err := conf.RequirePrevResult()
	return conf, bw, prev, err
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, bw, prev, err := chained(args)
	if err != nil {
		return err
	}
	if !bw.Shaped() {
		return types.PrintResult(prev, conf.CNIVersion)
	}
	dev, err := findHostVeth(args.Netns, args.IfName, prev)
	if err != nil {
		return err
	}
	ifb, err := shape(idOf(conf.Name, args), dev, bw)
	if err != nil {
		return err
	}
	if ifb != nil {
		prev.Interfaces = append(prev.Interfaces, &current.Interface{Name: ifb.Attrs().Name, Mac: ifb.Attrs().HardwareAddr.String()})
	}
	return types.PrintResult(prev, conf.CNIVersion)
}

// idOf is the attachment a call is about.
func idOf(network string, args *skel.CmdArgs) attachment.ID {
	return attachment.ID{Network: network, ContainerID: args.ContainerID, IfName: args.IfName}
}

// shape installs both directions on the host end dev, undoing everything
// on failure. It returns the ifb device when egress is shaped.
func shape(id attachment.ID, dev netlink.Link, bw Bandwidth) (ifb netlink.Link, err error) {
	tick := netlink.TickInUsec()
	name := id.Ifb()
	defer func() {
		if err != nil {
			if uerr := errors.Join(teardownIfb(name, dev, id.Network), removeTbf(dev)); uerr != nil {
				slog.Warn("undoing a failed ADD", "error", uerr)
			}
		}
	}()
	if bw.Ingress.Shaped() {
		p := tbfFor(bw.Ingress, dev.Attrs().MTU, tick)
		if err := setTbf(dev, p); err != nil {
			return nil, err
		}
		killpoint.Here("ingress tbf")
		slog.Info("ingress shaped", "dev", dev.Attrs().Name, "rateBytes", p.Rate, "bucketBytes", p.Bucket, "limitBytes", p.Limit)
	} else if err := removeTbf(dev); err != nil {
		return nil, err
	}
	if !bw.Egress.Shaped() {
		return nil, teardownIfb(name, dev, id.Network)
	}
	info := ifbInfo{Net: attachment.NetworkTag(id.Network), Dev: dev.Attrs().Index, ContainerID: id.ContainerID, IfName: id.IfName}
	ifb, info, created, err := createIfb(name, dev.Attrs().MTU, info)
	if err != nil {
		return nil, err
	}
	killpoint.Here("ifb labelled")
	owns, err := attachRedirect(dev, ifb)
	if err != nil {
		return nil, err
	}
	killpoint.Here("redirect")
	if created && owns != info.OwnsIngress {
		info.OwnsIngress = owns
		if err := netlink.LinkSetAlias(ifb, info.alias()); err != nil {
			return nil, err
		}
	}
	p := tbfFor(bw.Egress, dev.Attrs().MTU, tick)
	if err := setTbf(ifb, p); err != nil {
		return nil, err
	}
	killpoint.Here("egress tbf")
	slog.Info("egress shaped", "dev", dev.Attrs().Name, "ifb", name, "rateBytes", p.Rate, "bucketBytes", p.Bucket, "limitBytes", p.Limit, "ownsIngressQdisc", info.OwnsIngress)
	return ifb, nil
}

func cmdDel(args *skel.CmdArgs) error {
	conf, err := decodeConfig(args.StdinData)
	if err != nil {
		return err
	}
	// DEL undoes what any ADD may have done, whatever the config says now.
	var dev netlink.Link
	if args.Netns != "" {
		var prev *current.Result
		prev, _ = conf.PrevResultCurrent()
		d, err := findHostVeth(args.Netns, args.IfName, prev)
		switch {
		case err == nil:
			dev = d
		case netns.IsGone(err):
			slog.Info("pod namespace gone; removing what is left on the host", "error", err)
		default:
			slog.Info("host end of the veth not found; removing what is left on the host", "error", err)
		}
	}
	if dev != nil {
		if err := removeTbf(dev); err != nil {
			return err
		}
		killpoint.Here("ingress tbf removed")
	}
	// Both forms of the ifb's name (see attachment.IfbNames).
	id := idOf(conf.Name, args)
	for _, name := range id.IfbNames() {
		if err := teardownIfb(name, dev, id.Network); err != nil {
			return err
		}
	}
	// And the reference plugin's, for pods it set up before meshwire
	// replaced it.
	return deleteReferenceIfb(attachment.Reference{Network: id.Network, ContainerID: id.ContainerID}.IfbName())
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, bw, prev, err := chained(args)
	if err != nil {
		return err
	}
	dev, err := findHostVeth(args.Netns, args.IfName, prev)
	if err != nil {
		return err
	}
	obs, err := observeIfb(dev, idOf(conf.Name, args).IfbNames())
	if err != nil {
		return err
	}
	return verify(bw, dev.Attrs().MTU, netlink.TickInUsec(), attachment.NetworkTags(conf.Name), obs)
}

// observeIfb observes the attachment's shaping through the first of names
// (the forms of its ifb's name) that exists, or the first when none does.
func observeIfb(dev netlink.Link, names []string) (observed, error) {
	first, err := observe(dev, names[0])
	if err != nil || first.Ifb {
		return first, err
	}
	for _, name := range names[1:] {
		if o, err := observe(dev, name); err != nil || o.Ifb {
			return o, err
		}
	}
	return first, nil
}

// observed is what the kernel shows of one attachment's shaping.
type observed struct {
	Dev      string
	RootTbf  *netlink.Tbf // meshwire's tbf at the root of the host end
	IfbName  string
	Ifb      bool // the attachment's ifb exists
	IfbUp    bool
	IfbAlias string
	IfbTbf   *netlink.Tbf // meshwire's tbf at the root of the ifb
	Redirect bool         // the host end's ingress redirects to the ifb
}

func observe(dev netlink.Link, name string) (observed, error) {
	o := observed{Dev: dev.Attrs().Name, IfbName: name}
	var err error
	if o.RootTbf, err = ourTbf(dev); err != nil {
		return o, err
	}
	ifb, err := netlinksafe.LinkByName(name)
	if err != nil {
		if gone(err) {
			return o, nil
		}
		return o, err
	}
	o.Ifb, o.IfbUp, o.IfbAlias = true, ifb.Attrs().Flags&net.FlagUp != 0, ifb.Attrs().Alias
	if o.IfbTbf, err = ourTbf(ifb); err != nil {
		return o, err
	}
	q, err := ingressQdisc(dev)
	if err != nil || q == nil {
		return o, err
	}
	fs, err := redirectFilters(dev, q, ifb.Attrs().Index)
	o.Redirect = len(fs) > 0
	return o, err
}

// verify is CHECK's decision: the kernel must show exactly the shaping the
// config asks for.
func verify(bw Bandwidth, mtu int, tick float64, netTags []string, o observed) error {
	if bw.Ingress.Shaped() {
		if o.RootTbf == nil {
			return cnierr.CheckFailed("ingress: no meshwire tbf at the root of %s", o.Dev)
		}
		if err := sameTbf("ingress", o.Dev, tbfFor(bw.Ingress, mtu, tick), o.RootTbf); err != nil {
			return err
		}
	} else if o.RootTbf != nil {
		return cnierr.CheckFailed("ingress: %s is shaped but the config does not limit ingress", o.Dev)
	}
	if !bw.Egress.Shaped() {
		if o.Ifb {
			return cnierr.CheckFailed("egress: %s exists but the config does not limit egress", o.IfbName)
		}
		return nil
	}
	switch info, ok := parseAlias(o.IfbAlias); {
	case !o.Ifb:
		return cnierr.CheckFailed("egress: ifb device %s is missing", o.IfbName)
	case !ok || !slices.Contains(netTags, info.Net):
		return cnierr.CheckFailed("egress: %s does not belong to this network (alias %q)", o.IfbName, o.IfbAlias)
	case !o.IfbUp:
		return cnierr.CheckFailed("egress: %s is down", o.IfbName)
	case !o.Redirect:
		return cnierr.CheckFailed("egress: %s does not redirect what it receives to %s", o.Dev, o.IfbName)
	case o.IfbTbf == nil:
		return cnierr.CheckFailed("egress: no meshwire tbf at the root of %s", o.IfbName)
	}
	return sameTbf("egress", o.IfbName, tbfFor(bw.Egress, mtu, tick), o.IfbTbf)
}

func sameTbf(dir, dev string, want tbfParams, got *netlink.Tbf) error {
	switch {
	case got.Rate != want.Rate:
		return cnierr.CheckFailed("%s: %s rate is %d bit/s, the config asks for %d", dir, dev, got.Rate*8, want.Rate*8)
	case got.Buffer != want.Buffer:
		return cnierr.CheckFailed("%s: %s bucket is %d ticks, the config asks for %d (burst changed?)", dir, dev, got.Buffer, want.Buffer)
	case got.Limit != want.Limit:
		return cnierr.CheckFailed("%s: %s queue limit is %d bytes, want %d", dir, dev, got.Limit, want.Limit)
	}
	return nil
}

// cmdGC removes the ifb devices of this network whose attachment is not in
// the valid list, and only those.
func cmdGC(args *skel.CmdArgs) error {
	conf, err := decodeConfig(args.StdinData)
	if err != nil {
		return err
	}
	devs, err := ifbDevices()
	if err != nil {
		return err
	}
	valid := make([]attachment.ID, 0, len(conf.ValidAttachments))
	for _, a := range conf.ValidAttachments {
		valid = append(valid, attachment.ID{Network: conf.Name, ContainerID: a.ContainerID, IfName: a.IfName})
	}
	var errs []error
	for _, name := range gcVictims(conf.Name, devs, valid) {
		slog.Info("GC: removing stale ifb", "ifb", name)
		if err := teardownIfb(name, nil, conf.Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cmdStatus: bandwidth needs nothing but the kernel's tc, so it is ready
// once its config decodes.
func cmdStatus(args *skel.CmdArgs) error {
	_, _, err := parseConfig(args.StdinData)
	return err
}
