//go:build kernel

package main

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
)

// TestQdiscAt: the single-qdisc request answers what netlink's full listing
// shows for the root and the ingress slot, nothing for a hidden or empty
// slot and for a device that is gone, and CHECK's ourTbf reads meshwire's
// tbf with its parameters.
func TestQdiscAt(t *testing.T) {
	kerneltest.Require(t)
	_, p := kerneltest.NewNS(t, "qdisc")
	err := netns.Enter(p, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "mwta"}, PeerName: "mwtb"}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("mwta")
		if err != nil {
			return err
		}
		want := func(what string, parent uint32, kind string, handle uint32) {
			t.Helper()
			q, err := qdiscAt(l, parent)
			switch {
			case err != nil:
				t.Errorf("%s: %v", what, err)
			case kind == "" && q != nil:
				t.Errorf("%s: got %s %s, want none", what, q.Type(), netlink.HandleStr(q.Attrs().Handle))
			case kind != "" && (q == nil || q.Type() != kind || q.Attrs().Handle != handle || q.Attrs().Parent != parent || q.Attrs().LinkIndex != l.Attrs().Index):
				t.Errorf("%s: got %+v, want %s %s at %s", what, q, kind, netlink.HandleStr(handle), netlink.HandleStr(parent))
			}
		}
		want("down, root", netlink.HANDLE_ROOT, "", 0)
		want("down, ingress", netlink.HANDLE_INGRESS, "", 0)
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		want("up, root", netlink.HANDLE_ROOT, "noqueue", 0)
		p := tbfParams{Rate: 125000, Buffer: 20000, Limit: 30000}
		if err := setTbf(l, p); err != nil {
			return err
		}
		if err := netlink.QdiscAdd(&netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: ingressHandle, Parent: netlink.HANDLE_CLSACT}}); err != nil {
			return err
		}
		want("tbf, root", netlink.HANDLE_ROOT, "tbf", tbfHandle)
		want("clsact, ingress", netlink.HANDLE_INGRESS, "clsact", ingressHandle)
		tbf, err := ourTbf(l)
		if err != nil || tbf == nil || tbf.Rate != p.Rate || tbf.Limit != p.Limit {
			t.Errorf("ourTbf = %+v, %v; want rate %d limit %d", tbf, err, p.Rate, p.Limit)
		}
		if err := removeTbf(l); err != nil {
			return err
		}
		want("after removeTbf, root", netlink.HANDLE_ROOT, "noqueue", 0)
		if tbf, err := ourTbf(l); err != nil || tbf != nil {
			t.Errorf("ourTbf without meshwire's tbf = %+v, %v; want none", tbf, err)
		}
		if err := netlink.LinkDel(l); err != nil {
			return err
		}
		want("gone", netlink.HANDLE_ROOT, "", 0)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
