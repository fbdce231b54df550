package fastpath

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/netns"
)

// seedSidecars marks, in mw_sidecars, every network namespace of a running
// process where the proxy already listens on the outbound capture port:
// a listener of the proxy's uid, or with gid set one held by a process of
// that gid (a listener of anyone else makes no namespace a sidecar's). The
// sockops program marks a namespace when its sidecar calls listen(), which a
// sidecar started before attach did unseen. Without this, the first
// connection of each such pod would stay on TCP, and with a gid-only proxy
// every connection would. Namespaces that cannot be entered (a process
// exiting meanwhile) are skipped.
func seedSidecars(sidecars *ebpf.Map, port uint16, uid uint32, gid *uint32) (int, error) {
	var gidSockets map[uint32]bool
	if gid != nil {
		gidSockets = socketsOfGID(*gid)
	}
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
			listening = listensOn(port, uid, gidSockets)
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

// listensOn reports whether a TCP socket of uid, or one of gidSockets (by
// inode), listens on port in the namespace.
func listensOn(port uint16, uid uint32, gidSockets map[uint32]bool) bool {
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := netlink.SocketDiagTCP(fam)
		if err != nil {
			continue
		}
		for _, s := range socks {
			if s.State == unix.BPF_TCP_LISTEN && s.ID.SourcePort == port && (s.UID == uid || gidSockets[s.INode]) {
				return true
			}
		}
	}
	return false
}

// socketsOfGID returns the inodes of the sockets open in processes whose
// file-system gid is gid (what a socket's file records, and iptables'
// --gid-owner matches).
func socketsOfGID(gid uint32) map[uint32]bool {
	inodes := map[uint32]bool{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, proc := range procs {
		if fsgid, ok := procFSGID(proc); !ok || fsgid != gid {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join(proc, "fd"))
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(proc, "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(target, "socket:[") {
				continue
			}
			if n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]"), 10, 32); err == nil {
				inodes[uint32(n)] = true
			}
		}
	}
	return inodes
}

// procFSGID reads a process's file-system gid: the fourth value of the
// Gid line of its status.
func procFSGID(proc string) (uint32, bool) {
	f, err := os.Open(filepath.Join(proc, "status"))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Gid:"); ok {
			fields := strings.Fields(rest)
			if len(fields) < 4 {
				return 0, false
			}
			n, err := strconv.ParseUint(fields[3], 10, 32)
			return uint32(n), err == nil
		}
	}
	return 0, false
}
