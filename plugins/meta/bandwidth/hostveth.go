package main

import (
	"fmt"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/netns"
)

// podVeth is the pod's end of the veth as seen from inside its namespace.
type podVeth struct {
	Index     int // ifindex inside the pod's namespace
	PeerIndex int // ifindex of the other end (IFLA_LINK)
}

// readPodVeth looks at CNI_IFNAME inside the pod's namespace. Errors
// entering the namespace satisfy netns.IsGone.
func readPodVeth(nsPath, ifName string) (podVeth, error) {
	var pv podVeth
	err := netns.Enter(nsPath, func() error {
		l, err := netlinksafe.LinkByName(ifName)
		if err != nil {
			return cnierr.InvalidEnv("CNI_IFNAME", "no interface %q in the pod's namespace: %v", ifName, err)
		}
		if _, ok := l.(*netlink.Veth); !ok {
			return cnierr.Config("bandwidth shapes the host end of a veth, and %s is a %s: chain it after an interface plugin that makes a veth (bridge, veth, ptp)", ifName, l.Type())
		}
		pv = podVeth{Index: l.Attrs().Index, PeerIndex: l.Attrs().ParentIndex}
		return nil
	})
	return pv, err
}

// hostCandidates are the names prevResult gives for host-side interfaces,
// tried first.
func hostCandidates(prev *current.Result) []string {
	if prev == nil {
		return nil
	}
	var out []string
	for _, i := range prev.Interfaces {
		if i != nil && i.Sandbox == "" && i.Name != "" {
			out = append(out, i.Name)
		}
	}
	return out
}

// isHostEnd is the decision whether a host link is the peer of the pod's
// veth: a veth whose index is the pod end's peer index and whose own peer
// index is the pod end's index. Checking both sides guards against an
// unrelated host link that happens to have the same index as the pod's
// peer in some other namespace.
func isHostEnd(l netlink.Link, pv podVeth) bool {
	if _, ok := l.(*netlink.Veth); !ok {
		return false
	}
	return l.Attrs().Index == pv.PeerIndex && l.Attrs().ParentIndex == pv.Index
}

// findHostVeth returns the host end of the pod's veth CNI_IFNAME. It works
// whatever plugin made the pair (meshwire's bridge and veth, the reference
// bridge and ptp): prevResult's host interfaces are only hints.
func findHostVeth(nsPath, ifName string, prev *current.Result) (netlink.Link, error) {
	pv, err := readPodVeth(nsPath, ifName)
	if err != nil {
		return nil, err
	}
	if pv.PeerIndex <= 0 {
		return nil, cnierr.Internal("%s in the pod's namespace has no peer", ifName)
	}
	for _, name := range hostCandidates(prev) {
		if l, err := netlinksafe.LinkByName(name); err == nil && isHostEnd(l, pv) {
			return l, nil
		}
	}
	l, err := netlink.LinkByIndex(pv.PeerIndex)
	if err == nil && isHostEnd(l, pv) {
		return l, nil
	}
	return nil, cnierr.Internal("the host end of %s (ifindex %d) is not in the host namespace: %v", ifName, pv.PeerIndex, fmt.Sprint(err))
}
