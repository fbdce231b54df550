package fastpath

import (
	"fmt"
	"path/filepath"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/netns"
)

// seedSidecars marks, in mw_sidecars, every network namespace of a running
// process where something already listens on the outbound capture port: the
// sockops program marks a namespace when its sidecar calls listen(), which a
// sidecar started before attach did unseen. Without this, the first
// connection of each such pod would stay on TCP. Namespaces that cannot be
// entered (a process exiting meanwhile) are skipped.
func seedSidecars(sidecars *ebpf.Map, port uint16) (int, error) {
	paths, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	seen := map[uint64]bool{}
	marked := 0
	for _, p := range paths {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil || seen[st.Ino] {
			continue
		}
		seen[st.Ino] = true
		var cookie uint64
		listening := false
		err := netns.Enter(p, func() error {
			var err error
			if cookie, err = netnsCookie(); err != nil {
				return err
			}
			listening = listensOn(port)
			return nil
		})
		if err != nil || !listening {
			continue
		}
		if err := sidecars.Put(cookie, uint8(1)); err != nil {
			return marked, fmt.Errorf("mark a sidecar's namespace: %w", err)
		}
		marked++
	}
	return marked, nil
}

// netnsCookie is the calling thread's network namespace cookie, the value
// bpf_get_netns_cookie gives the programs (SO_NETNS_COOKIE, Linux 5.14).
func netnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("SO_NETNS_COOKIE: %w", err)
	}
	return v, nil
}

// listensOn reports whether a TCP socket of the namespace listens on port.
func listensOn(port uint16) bool {
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := netlink.SocketDiagTCP(fam)
		if err != nil {
			continue
		}
		for _, s := range socks {
			if s.State == unix.BPF_TCP_LISTEN && s.ID.SourcePort == port {
				return true
			}
		}
	}
	return false
}
