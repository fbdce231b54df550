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
// process where the proxy's uid already listens on the outbound capture
// port (a listener of another uid makes no namespace a sidecar's): the
// sockops program marks a namespace when its sidecar calls listen(), which a
// sidecar started before attach did unseen. Without this, the first
// connection of each such pod would stay on TCP. Namespaces that cannot be
// entered (a process exiting meanwhile) are skipped.
func seedSidecars(sidecars *ebpf.Map, port uint16, uid uint32) (int, error) {
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
			if cookie, err = netns.Cookie(); err != nil {
				return err
			}
			listening = listensOn(port, uid)
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

// listensOn reports whether a TCP socket of uid listens on port in the
// namespace.
func listensOn(port uint16, uid uint32) bool {
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := netlink.SocketDiagTCP(fam)
		if err != nil {
			continue
		}
		for _, s := range socks {
			if s.State == unix.BPF_TCP_LISTEN && s.ID.SourcePort == port && s.UID == uid {
				return true
			}
		}
	}
	return false
}
