package pods

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/ebpf/loader"
)

// The inbound program's tc filter on a pod's interface: meshwire's handle
// and name, so that a repeated ADD replaces it and DEL finds it, at a
// priority before the ones tc hands out by default.
const (
	filterName     = "meshwire-capture"
	filterHandle   = 0x6d77
	filterPriority = 1
)

// AttachIngress attaches the pinned inbound program to the ingress of every
// interface of the calling thread's namespace but lo and skip (the
// excluded interfaces), adding a clsact qdisc where the interface has no
// ingress qdisc. Run again, it replaces its own filters.
func AttachIngress(dir string, skip []string) error {
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(pinDir(dir), loader.PinIngress), nil)
	if err != nil {
		return fmt.Errorf("%w: open the inbound program: %v", ErrNotAttached, err)
	}
	defer prog.Close()
	links, err := podLinks(skip)
	if err != nil {
		return err
	}
	for _, l := range links {
		parent, err := ingressParent(l, true)
		if err != nil {
			return err
		}
		f := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: l.Attrs().Index, Parent: parent, Handle: filterHandle,
				Priority: filterPriority, Protocol: unix.ETH_P_ALL,
			},
			Fd: prog.FD(), Name: filterName, DirectAction: true,
		}
		if err := netlink.FilterReplace(f); err != nil {
			return fmt.Errorf("attach the inbound capture program to %s: %w", l.Attrs().Name, err)
		}
	}
	return nil
}

// DetachIngress removes the inbound program's filters from the calling
// thread's namespace, and then every clsact qdisc left with no filter on
// either hook: the one AttachIngress added (a qdisc carries no owner, and
// a kill between its creation and the filter's leaves it bare; inside a
// pod's namespace an empty clsact does nothing for anyone).
func DetachIngress() error {
	links, err := podLinks(nil)
	if err != nil {
		return err
	}
	for _, l := range links {
		f, err := ingressFilter(l)
		if err != nil {
			return err
		}
		if f != nil {
			if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("remove the inbound capture program from %s: %w", l.Attrs().Name, err)
			}
		}
		if err := removeBareClsact(l); err != nil {
			return err
		}
	}
	return nil
}

// removeBareClsact deletes l's clsact qdisc when no filter is under it.
func removeBareClsact(l netlink.Link) error {
	qs, err := netlinksafe.QdiscList(l)
	if err != nil {
		return fmt.Errorf("list the qdiscs of %s: %w", l.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Type() != "clsact" {
			continue
		}
		for _, hook := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := netlinksafe.FilterList(l, hook)
			if err != nil {
				return fmt.Errorf("list the filters of %s: %w", l.Attrs().Name, err)
			}
			if len(fs) > 0 {
				return nil
			}
		}
		if err := netlink.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("remove the clsact qdisc of %s: %w", l.Attrs().Name, err)
		}
	}
	return nil
}

// IngressMissing names the interfaces (but lo and skip) that lack the
// inbound program's filter.
func IngressMissing(skip []string) ([]string, error) {
	links, err := podLinks(skip)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, l := range links {
		f, err := ingressFilter(l)
		if err != nil {
			return nil, err
		}
		if f == nil {
			missing = append(missing, l.Attrs().Name)
		}
	}
	return missing, nil
}

func podLinks(skip []string) ([]netlink.Link, error) {
	all, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list the pod's interfaces: %w", err)
	}
	var out []netlink.Link
	for _, l := range all {
		if l.Attrs().Flags&net.FlagLoopback != 0 || slices.Contains(skip, l.Attrs().Name) {
			continue
		}
		out = append(out, l)
	}
	return out, nil
}

// ingressParent is where ingress filters of l go: under its ingress or
// clsact qdisc; with create, a clsact qdisc is added when it has none.
func ingressParent(l netlink.Link, create bool) (uint32, error) {
	qs, err := netlinksafe.QdiscList(l)
	if err != nil {
		return 0, fmt.Errorf("list the qdiscs of %s: %w", l.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Attrs().Parent != netlink.HANDLE_INGRESS {
			continue
		}
		if q.Type() == "clsact" {
			return netlink.HANDLE_MIN_INGRESS, nil
		}
		return netlink.MakeHandle(0xffff, 0), nil
	}
	if !create {
		return 0, nil
	}
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return 0, fmt.Errorf("add a clsact qdisc to %s: %w", l.Attrs().Name, err)
	}
	return netlink.HANDLE_MIN_INGRESS, nil
}

// ingressFilter returns meshwire's inbound filter on l, nil when absent.
func ingressFilter(l netlink.Link) (netlink.Filter, error) {
	parent, err := ingressParent(l, false)
	if err != nil || parent == 0 {
		return nil, err
	}
	fs, err := netlinksafe.FilterList(l, parent)
	if err != nil {
		return nil, fmt.Errorf("list the ingress filters of %s: %w", l.Attrs().Name, err)
	}
	for _, f := range fs {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Handle == filterHandle && bf.Priority == filterPriority && bf.Name == filterName {
			return f, nil
		}
	}
	return nil, nil
}
