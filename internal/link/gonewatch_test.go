package link

import (
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/netns"
)

// msg builds one netlink message of type typ about link idx.
func msg(typ uint16, idx int32) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg+6) // an unaligned length
	binary.NativeEndian.PutUint32(b[0:4], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint32(b[unix.NLMSG_HDRLEN+4:], uint32(idx))
	for len(b)%unix.NLMSG_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

func TestRemoved(t *testing.T) {
	batch := append(append(msg(unix.RTM_NEWLINK, 7), msg(unix.RTM_DELLINK, 8)...), msg(unix.RTM_DELLINK, 7)...)
	if !removed(batch, 7) || !removed(batch, 8) {
		t.Fatal("removal in a batch not seen")
	}
	if removed(batch, 9) || removed(msg(unix.RTM_NEWLINK, 7), 7) {
		t.Fatal("a removal seen that is not there")
	}
	for _, bad := range [][]byte{nil, {1, 2, 3}, msg(unix.RTM_DELLINK, 7)[:20]} {
		if removed(bad, 7) {
			t.Fatalf("truncated input %v read as a removal", bad)
		}
	}
}

// TestDeleteAndWait: the wait ends when another task deletes the link, a
// missing link is reported as such, and a start that fails deletes here.
func TestDeleteAndWait(t *testing.T) {
	name := fmt.Sprintf("mwt-link-%d", os.Getpid())
	p, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = netns.Delete(name) }()
	err = netns.Enter(p, func() error {
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
