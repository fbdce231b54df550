package netns

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// NS is a network namespace opened from its path (a plugin's CNI_NETNS)
// for netlink requests from the calling thread, which stays where it is
// (Enter is for the work that must run inside: sysctls, sockets).
type NS struct {
	FD vnetns.NsHandle // the open namespace file
	NL Netlink         // netlink into the namespace
}

// Netlink is a netlink handle into one namespace whose dumps are retried
// when the kernel interrupts them (NLM_F_DUMP_INTR, netlink's
// ErrDumpInterrupted): netlinksafe's handle, plus AddrList, which
// netlinksafe retries only in the host namespace.
type Netlink struct{ netlinksafe.Handle }

// dumpAttempts is netlinksafe's limit on retries of an interrupted dump.
const dumpAttempts = 5

// AddrList is netlink's AddrList in the handle's namespace, retried as
// netlinksafe retries its dumps: after the last interrupted attempt its
// (possibly inconsistent) data is returned without the error.
func (h Netlink) AddrList(l netlink.Link, family int) ([]netlink.Addr, error) {
	var addrs []netlink.Addr
	var err error
	for range dumpAttempts {
		addrs, err = h.Handle.Handle.AddrList(l, family)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return addrs, err
		}
	}
	slog.Debug("address dump interrupted on every attempt, using the last one", "attempts", dumpAttempts)
	return addrs, nil
}

// Open opens the namespace at path. Failures are code 4 naming CNI_NETNS
// and satisfy IsGone.
func Open(path string) (*NS, error) {
	if path == "" {
		return nil, cnierr.InvalidEnv("CNI_NETNS", "not set")
	}
	gone := func(err error) error {
		return errors.Join(cnierr.InvalidEnv("CNI_NETNS", "%v", err), &Gone{Err: err})
	}
	fd, err := vnetns.GetFromPath(path)
	if err != nil {
		return nil, gone(err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(fd), &st); err != nil || (st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC) {
		fd.Close()
		return nil, gone(fmt.Errorf("%s is not a network namespace", path))
	}
	h, err := netlinksafe.NewHandleAt(fd, unix.NETLINK_ROUTE)
	if err != nil {
		fd.Close()
		return nil, gone(err)
	}
	return &NS{FD: fd, NL: Netlink{h}}, nil
}

// Close releases the namespace.
func (n *NS) Close() {
	n.NL.Close()
	n.FD.Close()
}

// StillThere fails when the namespace file at path no longer names the
// namespace that was opened (it was deleted while ADD ran): ADD then undoes
// its work instead of reporting a pod nobody can reach.
func (n *NS) StillThere(path string) error {
	var opened, now unix.Stat_t
	if err := unix.Fstat(int(n.FD), &opened); err != nil {
		return cnierr.InvalidEnv("CNI_NETNS", "%v", err)
	}
	if err := unix.Stat(path, &now); err != nil || now.Ino != opened.Ino || now.Dev != opened.Dev {
		return cnierr.InvalidEnv("CNI_NETNS", "%s was deleted while ADD ran", path)
	}
	return nil
}
