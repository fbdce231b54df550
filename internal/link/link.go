// Package link creates and finds the veth pairs that connect a pod's network
// namespace to the host. The host end is named deterministically from the
// container id and interface name (so that DEL, GC and the chained plugins
// find it without state), and the peer is created directly inside the pod's
// namespace under its final name (no rename, no namespace move).
package link

import (
	"errors"
	"fmt"
	"net"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/netns"
)

// The host end's name is attachment.ID.HostVeth: these are its limits, as
// the configs validated here see them.
const (
	// DefaultHostPrefix starts the host end's name when none is configured,
	// as with the reference plugins.
	DefaultHostPrefix = attachment.DefaultVethPrefix
	// MaxPrefixLen leaves at least 4 hex digits of hash in a 15-byte name.
	MaxPrefixLen = attachment.MaxVethPrefixLen
	// IFNameSize is the kernel's limit on interface names, without the NUL.
	IFNameSize = attachment.IFNameSize
)

// ValidPrefix reports whether prefix can start host veth names.
func ValidPrefix(prefix string) error {
	if len(prefix) > MaxPrefixLen {
		return fmt.Errorf("%q is longer than %d bytes", prefix, MaxPrefixLen)
	}
	for _, c := range prefix {
		if c <= ' ' || c == '/' || c == ':' || c > '~' {
			return fmt.Errorf("%q holds a character not allowed in interface names", prefix)
		}
	}
	return nil
}

// ValidIfName reports whether name is a usable interface name.
func ValidIfName(name string) error {
	if name == "" || len(name) > IFNameSize || name == "." || name == ".." {
		return fmt.Errorf("%q is not a valid interface name (1 to %d bytes)", name, IFNameSize)
	}
	for _, c := range name {
		if c <= ' ' || c == '/' || c == ':' || c > '~' {
			return fmt.Errorf("%q holds a character not allowed in interface names", name)
		}
	}
	return nil
}

// Pair is a veth pair to create.
type Pair struct {
	HostName string           // name of the host end
	PeerName string           // name of the end inside the namespace (CNI_IFNAME)
	MTU      int              // 0: kernel default
	PeerMAC  net.HardwareAddr // nil: random
	NS       vnetns.NsHandle  // the pod's namespace
}

// ErrExists is returned by Create when the host end's name is taken.
var ErrExists = errors.New("link exists")

// Create makes the pair with one netlink request from the host namespace:
// the peer is born inside the pod's namespace. It returns the host end.
// A name clash on either side is ErrExists (wrapped with the name).
func Create(p Pair) (netlink.Link, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = p.HostName
	attrs.MTU = p.MTU
	v := &netlink.Veth{
		LinkAttrs:        attrs,
		PeerName:         p.PeerName,
		PeerNamespace:    netlink.NsFd(p.NS),
		PeerHardwareAddr: p.PeerMAC,
		PeerTxQLen:       -1,
	}
	if err := netlink.LinkAdd(v); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create veth %s/%s: %w", p.HostName, p.PeerName, ErrExists)
		}
		return nil, fmt.Errorf("create veth %s (peer %s): %w", p.HostName, p.PeerName, err)
	}
	host, err := netlinksafe.LinkByName(p.HostName)
	if err != nil {
		return nil, fmt.Errorf("find new veth %s: %w", p.HostName, err)
	}
	return host, nil
}

// DeleteByName removes a link of the host namespace; a missing link is not an
// error. It reports whether something was deleted.
func DeleteByName(name string) (bool, error) {
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		if IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	if err := netlink.LinkDel(l); err != nil && !IsNotFound(err) && !errors.Is(err, unix.ENODEV) {
		return false, fmt.Errorf("delete %s: %w", name, err)
	}
	return true, nil
}

// IsNotFound reports whether err says a link does not exist.
func IsNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// HostPeerIndex returns the host-side ifindex of the veth named ifName inside
// the namespace reached by h (IFLA_LINK of a veth is its peer's index).
func HostPeerIndex(h netns.Netlink, ifName string) (int, error) {
	l, err := h.LinkByName(ifName)
	if err != nil {
		return 0, err
	}
	if _, ok := l.(*netlink.Veth); !ok {
		return 0, fmt.Errorf("%s is a %s, not a veth", ifName, l.Type())
	}
	if l.Attrs().ParentIndex == 0 {
		return 0, fmt.Errorf("%s has no peer", ifName)
	}
	return l.Attrs().ParentIndex, nil
}

// FindHostVeth returns the host end of the pod's veth ifName inside the
// namespace at netnsPath, whatever plugin made the pair (meshwire's bridge
// and veth, the reference bridge and ptp). hints (e.g. prevResult's host
// interfaces, or attachment.ID.HostVeth) are tried first; a host link is accepted only
// when both sides agree: it is a veth whose index is the pod end's peer
// index and whose own peer index is the pod end's index, so an unrelated
// host link that happens to carry the same index is never taken.
//
// Errors entering the namespace satisfy netns.IsGone; a missing ifName is
// code 4 naming CNI_IFNAME; an ifName that is not a veth is code 7.
func FindHostVeth(netnsPath, ifName string, hints ...string) (netlink.Link, error) {
	var podIndex, peerIndex int
	err := netns.Enter(netnsPath, func() error {
		l, err := netlinksafe.LinkByName(ifName)
		if err != nil {
			return cnierr.InvalidEnv("CNI_IFNAME", "no interface %q in the pod's namespace: %v", ifName, err)
		}
		if _, ok := l.(*netlink.Veth); !ok {
			return cnierr.Config("%s is a %s, not a veth: chain this plugin after an interface plugin that makes a veth (bridge, veth, ptp)", ifName, l.Type())
		}
		podIndex, peerIndex = l.Attrs().Index, l.Attrs().ParentIndex
		return nil
	})
	if err != nil {
		return nil, err
	}
	if peerIndex <= 0 {
		return nil, cnierr.Internal("%s in the pod's namespace has no peer", ifName)
	}
	for _, name := range hints {
		if l, err := netlinksafe.LinkByName(name); err == nil && IsHostEnd(l, podIndex, peerIndex) {
			return l, nil
		}
	}
	l, err := netlink.LinkByIndex(peerIndex)
	if err == nil && IsHostEnd(l, podIndex, peerIndex) {
		return l, nil
	}
	return nil, cnierr.Internal("the host end of %s (ifindex %d) is not in the host namespace: %v", ifName, peerIndex, fmt.Sprint(err))
}

// IsHostEnd decides whether a host link is the peer of a pod's veth whose
// own index is podIndex and whose peer index is peerIndex: both sides must
// agree.
func IsHostEnd(l netlink.Link, podIndex, peerIndex int) bool {
	_, ok := l.(*netlink.Veth)
	return ok && l.Attrs().Index == peerIndex && l.Attrs().ParentIndex == podIndex
}

// HostInterfaceNames are the host-side interfaces of a result (those without
// a sandbox): hints for FindHostVeth.
func HostInterfaceNames(r *current.Result) []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, i := range r.Interfaces {
		if i != nil && i.Sandbox == "" && i.Name != "" {
			out = append(out, i.Name)
		}
	}
	return out
}

// DeleteJobName is the detached job that deletes a host link (see
// DeleteAndWait).
const DeleteJobName = "dellink"

// DeleteJob is the detached child's work: delete the named host link.
func DeleteJob(name string) error {
	_, err := DeleteByName(name)
	return err
}

// DeleteAndWait deletes the host link name and returns once it is gone from
// the kernel's view (its RTM_DELLINK is out: name, addresses, routes, and a
// veth's peer with them, are released). The deletion itself runs in a
// detached child (start), because the deleting task then waits in the
// kernel for the device's memory to be reclaimed after RCU grace periods
// (15 to 30 ms here) while nothing is visible any more. When the child cannot
// be started or the link is not gone within timeout, the link is deleted
// here. A missing link is not an error; deleted reports whether one was
// there.
func DeleteAndWait(name string, start func() error, timeout time.Duration) (deleted bool, err error) {
	w, err := newGoneWatch()
	if err != nil {
		return DeleteByName(name)
	}
	defer w.Close()
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		if IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	if err := start(); err != nil {
		return DeleteByName(name)
	}
	if err := w.wait(l.Attrs().Index, time.Now().Add(timeout)); err != nil {
		return DeleteByName(name)
	}
	return true, nil
}
