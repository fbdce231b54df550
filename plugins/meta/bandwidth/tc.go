package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/killpoint"
)

// Traffic-control objects meshwire creates. Its tbf qdiscs carry the handle
// 6d77: ("mw"), so that DEL, CHECK and a repeated ADD recognise them and
// never take someone else's root qdisc for theirs.
var (
	tbfHandle = netlink.MakeHandle(0x6d77, 0)
	// ingressHandle is the handle every ingress (and clsact) qdisc has.
	ingressHandle = netlink.MakeHandle(0xffff, 0)
)

// filterPriority of the redirect filter on the host end's ingress: after the
// priorities tc assigns by default (49152 and counting down), so that filters
// an administrator put on the same device run first.
const filterPriority = 0xfe00

// rootQdisc returns the qdisc at the root of link, nil when there is none.
func rootQdisc(link netlink.Link) (netlink.Qdisc, error) {
	return qdiscAt(link, netlink.HANDLE_ROOT)
}

// ingressQdisc returns the qdisc in the ingress slot of link (an ingress or
// a clsact qdisc), nil when there is none.
func ingressQdisc(link netlink.Link) (netlink.Qdisc, error) {
	return qdiscAt(link, netlink.HANDLE_INGRESS)
}

// filterParent is where ingress filters go on the given ingress-slot qdisc.
func filterParent(q netlink.Qdisc) uint32 {
	if q.Type() == "clsact" {
		return netlink.HANDLE_MIN_INGRESS
	}
	return ingressHandle
}

// isOurTbf reports whether q (from qdiscAt, nil for none) is meshwire's tbf.
func isOurTbf(q netlink.Qdisc) bool {
	return q != nil && q.Type() == "tbf" && q.Attrs().Handle == tbfHandle
}

// setTbf puts meshwire's tbf at the root of link, replacing the kernel's
// default qdisc or an earlier meshwire tbf, and refusing to replace a root
// qdisc someone else installed.
func setTbf(link netlink.Link, p tbfParams) error {
	root, err := rootQdisc(link)
	if err != nil {
		return err
	}
	if root != nil && root.Attrs().Handle != 0 {
		if !isOurTbf(root) {
			return cnierr.Internal("%s already has a root qdisc (%s %s) that meshwire did not create; not replacing it",
				link.Attrs().Name, root.Type(), netlink.HandleStr(root.Attrs().Handle))
		}
	}
	q := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: tbfHandle, Parent: netlink.HANDLE_ROOT},
		Rate:       p.Rate,
		Buffer:     p.Buffer,
		Limit:      p.Limit,
	}
	if err := netlink.QdiscReplace(q); err != nil {
		return fmt.Errorf("set tbf on %s: %w", link.Attrs().Name, err)
	}
	return nil
}

// removeTbf deletes meshwire's tbf from the root of link; any other root
// qdisc is left alone.
func removeTbf(link netlink.Link) error {
	root, err := rootQdisc(link)
	if err != nil || root == nil {
		return err
	}
	if !isOurTbf(root) {
		return nil
	}
	if err := netlink.QdiscDel(root); err != nil && !gone(err) {
		return fmt.Errorf("delete tbf of %s: %w", link.Attrs().Name, err)
	}
	return nil
}

// gone reports errors that mean the object is not there any more.
func gone(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL)
}

// createIfb makes the attachment's ifb device, up, with its alias. An
// existing device of that name (a repeated ADD) is returned as it is, with
// the alias it carries.
func createIfb(name string, mtu int, info ifbInfo) (netlink.Link, ifbInfo, bool, error) {
	if l, err := netlinksafe.LinkByName(name); err == nil {
		if old, ok := parseAlias(l.Attrs().Alias); ok {
			if old.Net != info.Net {
				return nil, info, false, cnierr.Internal("ifb %s exists and belongs to another network (alias %q)", name, l.Attrs().Alias)
			}
			return l, old, false, nil
		}
		if !halfMade(l) {
			return nil, info, false, cnierr.Internal("a device named %s exists and was not made by meshwire's bandwidth plugin", name)
		}
		// A killed ADD of this attachment made it: label it now.
		if err := netlink.LinkSetAlias(l, info.alias()); err != nil {
			return nil, info, false, fmt.Errorf("set alias of %s: %w", name, err)
		}
		return l, info, true, nil
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	attrs.MTU = mtu
	attrs.Flags = net.FlagUp
	if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: attrs}); err != nil {
		return nil, info, false, fmt.Errorf("create ifb %s: %w", name, err)
	}
	killpoint.Here("ifb created")
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		return nil, info, true, fmt.Errorf("find new ifb %s: %w", name, err)
	}
	// The kernel does not take an alias at creation; until it is set, the
	// device is meshwire's by its name only (halfMade), so a failure here
	// removes it.
	if err := netlink.LinkSetAlias(l, info.alias()); err != nil {
		_ = netlink.LinkDel(l)
		return nil, info, false, fmt.Errorf("set alias of %s: %w", name, err)
	}
	return l, info, true, nil
}

// halfMade reports whether l, found under an attachment's ifb name, is an
// ifb that ADD created and had not labelled yet when it was killed: an ifb
// with no alias at all. The name (attachment.ID.Ifb: meshwire's prefix and
// a hash of the container id and interface) is this attachment's and no
// one else's, so such a device is the attachment's own.
func halfMade(l netlink.Link) bool {
	return l.Type() == "ifb" && l.Attrs().Alias == ""
}

// redirectFilters returns meshwire's redirect filters on the ingress of dev
// that send to the ifb with index ifbIndex (any ifb when ifbIndex is 0).
func redirectFilters(dev netlink.Link, q netlink.Qdisc, ifbIndex int) ([]netlink.Filter, error) {
	fs, err := netlinksafe.FilterList(dev, filterParent(q))
	if err != nil {
		return nil, fmt.Errorf("list filters of %s: %w", dev.Attrs().Name, err)
	}
	var out []netlink.Filter
	for _, f := range fs {
		u, ok := f.(*netlink.U32)
		if !ok || u.Priority != filterPriority {
			continue
		}
		for _, a := range u.Actions {
			if m, ok := a.(*netlink.MirredAction); ok && m.MirredAction == netlink.TCA_EGRESS_REDIR && (ifbIndex == 0 || m.Ifindex == ifbIndex) {
				out = append(out, f)
				break
			}
		}
	}
	return out, nil
}

// attachRedirect sends everything the host end of the veth receives (what
// the pod sends) to the ifb. An ingress or clsact qdisc already on the
// device is used as it is; otherwise one is created. It reports whether it
// created the qdisc.
func attachRedirect(dev, ifb netlink.Link) (bool, error) {
	created := false
	q, err := ingressQdisc(dev)
	if err != nil {
		return false, err
	}
	if q == nil {
		ing := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}}
		switch err := netlink.QdiscAdd(ing); {
		case err == nil:
			created = true
		case errors.Is(err, unix.EEXIST):
			// Someone added one in the meantime: share it.
		default:
			return false, fmt.Errorf("add ingress qdisc to %s: %w", dev.Attrs().Name, err)
		}
		if q, err = ingressQdisc(dev); err != nil || q == nil {
			return created, fmt.Errorf("ingress qdisc of %s vanished: %v", dev.Attrs().Name, err)
		}
	}
	have, err := redirectFilters(dev, q, ifb.Attrs().Index)
	if err != nil || len(have) > 0 {
		return created, err
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: dev.Attrs().Index,
			Parent:    filterParent(q),
			Priority:  filterPriority,
			Protocol:  unix.ETH_P_ALL,
		},
		Actions: []netlink.Action{netlink.NewMirredAction(ifb.Attrs().Index)},
	}
	if err := netlink.FilterAdd(f); err != nil {
		return created, fmt.Errorf("add redirect filter on %s to %s: %w", dev.Attrs().Name, ifb.Attrs().Name, err)
	}
	return created, nil
}

// detachRedirect removes meshwire's redirect filters to ifbIndex from dev
// and, when ownsIngress says ADD created the ingress qdisc and no filter of
// anyone is left on it, the qdisc too. A qdisc meshwire did not create is
// never deleted.
func detachRedirect(dev netlink.Link, ifbIndex int, ownsIngress bool) error {
	q, err := ingressQdisc(dev)
	if err != nil || q == nil {
		return err
	}
	ours, err := redirectFilters(dev, q, ifbIndex)
	if err != nil {
		return err
	}
	for _, f := range ours {
		if err := netlink.FilterDel(f); err != nil && !gone(err) {
			return fmt.Errorf("delete redirect filter on %s: %w", dev.Attrs().Name, err)
		}
	}
	if !ownsIngress || len(ours) == 0 {
		return nil
	}
	left, err := netlinksafe.FilterList(dev, filterParent(q))
	if err != nil {
		return fmt.Errorf("list filters of %s: %w", dev.Attrs().Name, err)
	}
	if len(left) > 0 {
		slog.Info("keeping the ingress qdisc: other filters use it", "dev", dev.Attrs().Name, "filters", len(left))
		return nil
	}
	if err := netlink.QdiscDel(q); err != nil && !gone(err) {
		return fmt.Errorf("delete ingress qdisc of %s: %w", dev.Attrs().Name, err)
	}
	return nil
}

// ifbDevices lists the host's ifb devices named by meshwire's bandwidth
// plugin, with their aliases.
func ifbDevices() (map[string]string, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	out := map[string]string{}
	for _, l := range links {
		if l.Type() == "ifb" {
			out[l.Attrs().Name] = l.Attrs().Alias
		}
	}
	return out, nil
}

// teardownIfb undoes the egress part of one attachment of network: the
// redirect on the host end (when dev is known) and the ifb device. A
// missing device is not an error, nor one of another network (the ifb's
// name does not hold the network, its alias does), which is left alone.
func teardownIfb(name string, dev netlink.Link, network string) error {
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		if gone(err) {
			return nil
		}
		return fmt.Errorf("find %s: %w", name, err)
	}
	info, ok := parseAlias(l.Attrs().Alias)
	if !ok && halfMade(l) {
		// Made by an ADD killed before it labelled it: nothing points at
		// it yet (the redirect comes after the alias).
		slog.Info("deleting the ifb a killed ADD left unlabelled", "device", name)
		if err := netlink.LinkDel(l); err != nil && !gone(err) {
			return fmt.Errorf("delete %s: %w", name, err)
		}
		return nil
	}
	if !ok {
		// Not ours after all: leave it, and let DEL succeed.
		slog.Warn("not deleting a device meshwire did not make", "device", name, "type", l.Type(), "alias", l.Attrs().Alias)
		return nil
	}
	if !slices.Contains(attachment.NetworkTags(network), info.Net) {
		slog.Warn("not deleting the ifb of another network", "device", name, "alias", l.Attrs().Alias)
		return nil
	}
	if dev == nil && info.Dev > 0 {
		// The pod's namespace is gone; the host end may still be there.
		if d, err := netlink.LinkByIndex(info.Dev); err == nil {
			dev = d
		}
	}
	if dev != nil {
		if err := detachRedirect(dev, l.Attrs().Index, info.OwnsIngress); err != nil {
			return err
		}
		killpoint.Here("redirect removed")
	}
	if err := netlink.LinkDel(l); err != nil && !gone(err) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// deleteReferenceIfb removes the ifb the reference plugin made for an
// attachment, if there is one (its filters and qdiscs go with the device or
// with the veth the interface plugin deletes next).
func deleteReferenceIfb(name string) error {
	l, err := netlinksafe.LinkByName(name)
	if err != nil || l.Type() != "ifb" {
		return nil
	}
	slog.Info("removing the reference plugin's ifb", "ifb", name)
	if err := netlink.LinkDel(l); err != nil && !gone(err) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}
