package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/killpoint"
	"github.com/meshwire/meshwire/internal/refrules"
	"github.com/meshwire/meshwire/internal/ruleset"
)

const cmdTimeout = 60 * time.Second

func newAttachment(args *skel.CmdArgs, c *config) attachment.ID {
	return attachment.ID{ContainerID: args.ContainerID, IfName: args.IfName, Network: c.raw.Name}
}

// prepared is what ADD and CHECK work from: the config, prevResult, the
// attachment, the container's addresses and the per-family plans.
type prepared struct {
	c      *config
	prev   *current.Result
	a      attachment.ID
	v4, v6 *net.IPNet
	plans  []famPlan
}

func prepare(args *skel.CmdArgs) (*prepared, error) {
	c, err := parseConfig(args.StdinData)
	if err != nil {
		return nil, err
	}
	prev, err := c.raw.RequirePrevResult()
	if err != nil {
		return nil, err
	}
	p := &prepared{c: c, prev: prev, a: newAttachment(args, c)}
	p.v4, p.v6 = containerAddrs(prev, args.IfName)
	p.plans = plan(c, p.a, p.v4, p.v6)
	return p, nil
}

func cmdAdd(args *skel.CmdArgs) error {
	p, err := prepare(args)
	if err != nil {
		return err
	}
	if len(p.plans) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		defer cancel()
		err := withDriver(ctx, p.c, func(d driver, _ *firewall.Host) error { return install(ctx, d, p.c, p.a, p.plans, p.v4) })
		if err != nil {
			return err
		}
	} else {
		slog.Debug("nothing to map", "mappings", len(p.c.Mappings), "v4", p.v4 != nil, "v6", p.v6 != nil)
	}
	return types.PrintResult(p.prev, p.c.raw.CNIVersion)
}

// withDriver runs fn with the driver of the backend c resolves to, on the
// firewall front door of the host network namespace.
func withDriver(ctx context.Context, c *config, fn func(driver, *firewall.Host) error) error {
	b, err := resolveBackend(ctx, c)
	if err != nil {
		return err
	}
	slog.Debug("backend", "backend", b.String(), "configured", c.Backend != nil, "implied", c.Implied)
	fw := firewall.New(b)
	defer fw.Close() // portmap reads over netlink and commits through the tools: nothing to hand on
	return fn(newDriver(fw), fw)
}

// install programs the plans, then the host settings they need; a failure
// undoes the rules.
func install(ctx context.Context, d driver, c *config, a attachment.ID, plans []famPlan, v4 *net.IPNet) error {
	err := d.add(ctx, a, plans)
	killpoint.Here("rules")
	if err == nil && v4 != nil && planned(plans, ruleset.V4) && needsLocalnet(c) {
		err = enableLocalnet(v4.IP)
	}
	if err != nil {
		if _, derr := d.del(ctx, []string{a.PortmapKey()}, families(plans), false); derr != nil {
			slog.Warn("undo after a failed ADD", "error", derr)
		}
		return err
	}
	for _, p := range plans {
		flushUDP(p.Family, udpPorts(c.Mappings, p.Family))
	}
	return nil
}

func planned(plans []famPlan, f ruleset.IPVersion) bool {
	for _, p := range plans {
		if p.Family == f {
			return true
		}
	}
	return false
}

func families(plans []famPlan) []ruleset.IPVersion {
	var out []ruleset.IPVersion
	for _, p := range plans {
		out = append(out, p.Family)
	}
	return out
}

func cmdDel(args *skel.CmdArgs) error {
	c, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	a := newAttachment(args, c)
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	fams := delFamilies(c, args.IfName)
	var udp map[ruleset.IPVersion][]int
	err = withDriver(ctx, c, func(d driver, fw *firewall.Host) error {
		var err error
		if udp, err = d.del(ctx, a.PortmapKeys(), fams, len(c.Mappings) == 0); err != nil || len(c.Mappings) == 0 {
			return err
		}
		killpoint.Here("rules removed")
		// What the reference portmap set up before an in-place upgrade (its
		// DEL acts only with mappings), on the same netlink connection.
		return cnierr.Wrap(refrules.DelPortmap(ctx, fw, attachment.Reference{Network: c.raw.Name, ContainerID: args.ContainerID}), "the reference's port mappings")
	})
	if err != nil {
		return err
	}
	for _, f := range fams {
		ports := udp[f]
		if len(c.Mappings) > 0 {
			ports = udpPorts(c.Mappings, f)
		}
		flushUDP(f, ports)
	}
	return nil
}

// delFamilies narrows DEL to the families the container had addresses in
// when the runtime passes prevResult (the ADD result); without it, both.
func delFamilies(c *config, ifName string) []ruleset.IPVersion {
	both := []ruleset.IPVersion{ruleset.V4, ruleset.V6}
	prev, err := c.raw.PrevResultCurrent()
	if err != nil || prev == nil {
		return both
	}
	v4, v6 := containerAddrs(prev, ifName)
	var out []ruleset.IPVersion
	if v4 != nil {
		out = append(out, ruleset.V4)
	}
	if v6 != nil {
		out = append(out, ruleset.V6)
	}
	if len(out) == 0 {
		return both
	}
	return out
}

func cmdCheck(args *skel.CmdArgs) error {
	p, err := prepare(args)
	if err != nil || len(p.plans) == 0 {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	return withDriver(ctx, p.c, func(d driver, _ *firewall.Host) error { return d.check(ctx, p.a, p.plans) })
}

func cmdGC(args *skel.CmdArgs) error {
	c, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	valid := map[string]bool{}
	for _, v := range c.raw.ValidAttachments {
		// Both forms of the key: a valid attachment's chains stay whichever
		// meshwire made them.
		for _, k := range (attachment.ID{ContainerID: v.ContainerID, IfName: v.IfName}).PortmapKeys() {
			valid[k] = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	return withDriver(ctx, c, func(d driver, fw *firewall.Host) error {
		if err := d.gc(ctx, c.raw.Name, valid); err != nil {
			return err
		}
		return cnierr.Wrap(refrules.GCPortmap(ctx, fw, c.raw.Name, c.raw.ValidAttachments), "the reference's port mappings")
	})
}

func cmdStatus(args *skel.CmdArgs) error {
	c, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	b, err := resolveBackend(ctx, c)
	if err != nil {
		return err
	}
	return b.Available(ctx)
}

// enableLocalnet sets route_localnet on the host interface that routes to
// the container, so that connections to 127.0.0.1:hostPort, DNATed to the
// container and masqueraded, may leave through it. It is never reset: the
// interface (a bridge) is shared with other containers.
func enableLocalnet(containerIP net.IP) error {
	routes, err := netlink.RouteGet(containerIP)
	if err != nil || len(routes) == 0 {
		// As the reference plugin: no route, no interface to set.
		slog.Info("no host route toward the container; route_localnet not set", "ip", containerIP.String(), "error", err)
		return nil
	}
	link, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return cnierr.Internal("find the host interface toward %s: %v", containerIP, err)
	}
	key := fmt.Sprintf("net/ipv4/conf/%s/route_localnet", link.Attrs().Name)
	if v, err := sysctl.Sysctl(key); err == nil && v == "1" {
		return nil
	}
	if _, err := sysctl.Sysctl(key, "1"); err != nil {
		return cnierr.Internal("set %s: %v", key, err)
	}
	return nil
}

// flushUDP deletes conntrack entries of UDP flows to the given host ports,
// so that a client that kept sending to a port before it was mapped (or
// after it was unmapped) does not stay stuck on a stale entry. Failures
// are logged only: the mapping itself is in place.
func flushUDP(f ruleset.IPVersion, ports []int) {
	if len(ports) == 0 {
		return
	}
	family := netlink.InetFamily(unix.AF_INET)
	if f == ruleset.V6 {
		family = unix.AF_INET6
	}
	var filters []netlink.CustomConntrackFilter
	for _, p := range ports {
		flt := &netlink.ConntrackFilter{}
		if err := flt.AddProtocol(unix.IPPROTO_UDP); err != nil {
			continue
		}
		if err := flt.AddPort(netlink.ConntrackOrigDstPort, uint16(p)); err != nil {
			continue
		}
		filters = append(filters, flt)
	}
	n, err := netlinksafe.ConntrackDeleteFilters(netlink.ConntrackTable, family, filters...)
	if err != nil {
		slog.Warn("flush UDP conntrack entries", "family", int(f), "ports", ports, "error", err)
		return
	}
	slog.Debug("flushed UDP conntrack entries", "family", int(f), "ports", ports, "deleted", n)
}
