//go:build kernel

package link

import (
	"fmt"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
)

// TestDeleteAndWait: the wait ends when another task deletes the link, a
// missing link is reported as such, and a start that fails deletes here.
func TestDeleteAndWait(t *testing.T) {
	kerneltest.Require(t)
	_, p := kerneltest.NewNS(t, "link")
	err := netns.Enter(p, func() error {
		mk := func() {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "mwta"}, PeerName: "mwtb"}); err != nil {
				t.Fatal(err)
			}
		}
		mk()
		// Only the removal's announcement may end the wait within the
		// bound checked below, not the fallback lookup.
		defer func(old time.Duration) { pollSlice = old }(pollSlice)
		pollSlice = 10 * time.Second
		started := time.Now()
		deleted, err := DeleteAndWait("mwta", func() error {
			// Another task, as the detached child is: its own handle into
			// the namespace, used from another thread.
			nsh, err := vnetns.GetFromPath(p)
			if err != nil {
				return err
			}
			h, err := netlink.NewHandleAt(nsh)
			nsh.Close()
			if err != nil {
				return err
			}
			go func() {
				defer h.Close()
				time.Sleep(30 * time.Millisecond)
				if l, err := h.LinkByName("mwta"); err == nil {
					_ = h.LinkDel(l)
				}
			}()
			return nil
		}, 5*time.Second)
		if err != nil || !deleted {
			return fmt.Errorf("DeleteAndWait = %v, %v", deleted, err)
		}
		if d := time.Since(started); d < 30*time.Millisecond || d > 2*time.Second {
			return fmt.Errorf("returned after %v: not when the other task deleted the link", d)
		}
		if _, err := netlink.LinkByName("mwtb"); !IsNotFound(err) {
			return fmt.Errorf("peer still there: %v", err)
		}
		if deleted, err := DeleteAndWait("mwta", func() error { return fmt.Errorf("not called") }, time.Second); deleted || err != nil {
			return fmt.Errorf("missing link: %v, %v", deleted, err)
		}
		mk()
		if deleted, err := DeleteAndWait("mwta", func() error { return fmt.Errorf("cannot start") }, time.Second); !deleted || err != nil {
			return fmt.Errorf("failed start: %v, %v", deleted, err)
		}
		if _, err := netlink.LinkByName("mwta"); !IsNotFound(err) {
			return fmt.Errorf("link left after a failed start: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
