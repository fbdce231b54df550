package link

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// goneWatch listens for the kernel's link-removal announcements
// (RTM_DELLINK on RTNLGRP_LINK) and reads only the ifindex of each: with
// many pods torn down at once every listener hears every removal, and
// decoding each whole announcement (as a generic link subscription does)
// cost a DEL more than the rest of its netlink work.
type goneWatch struct {
	fd  int
	buf []byte
}

func newGoneWatch() (*goneWatch, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.RTNLGRP_LINK - 1)}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return &goneWatch{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (w *goneWatch) Close() { unix.Close(w.fd) }

// pollSlice is how long one read waits before the link is looked up
// directly (an announcement can be lost when the socket's buffer overruns).
// A variable for the test that the announcement alone ends the wait.
var pollSlice = 50 * time.Millisecond

// wait returns nil once link idx is removed, or an error at deadline.
func (w *goneWatch) wait(idx int, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("link %d still there after the deadline", idx)
		}
		tv := unix.NsecToTimeval(min(left, pollSlice).Nanoseconds())
		if err := unix.SetsockoptTimeval(w.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		n, _, err := unix.Recvfrom(w.fd, w.buf, 0)
		switch {
		case err == nil:
			if removed(w.buf[:n], idx) {
				return nil
			}
			continue
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ENOBUFS):
			// A quiet slice, or announcements lost: look it up.
			if _, err := netlink.LinkByIndex(idx); IsNotFound(err) {
				return nil
			}
		default:
			return os.NewSyscallError("recvfrom", err)
		}
	}
}

// removed reports whether the netlink messages in b announce the removal
// of link idx (nlmsghdr, then ifinfomsg whose ifi_index is at offset 4).
func removed(b []byte, idx int) bool {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return false
		}
		body := b[unix.NLMSG_HDRLEN:l]
		if typ == unix.RTM_DELLINK && len(body) >= unix.SizeofIfInfomsg && int(int32(binary.NativeEndian.Uint32(body[4:8]))) == idx {
			return true
		}
		next := (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
		if next > len(b) {
			return false
		}
		b = b[next:]
	}
	return false
}
