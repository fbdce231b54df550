package netns

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Inode is the nsfs inode of the calling thread's network namespace: what
// Live lists for it while the namespace exists.
func Inode() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, fmt.Errorf("stat the network namespace: %w", err)
	}
	return st.Ino, nil
}

// hostPIDNamespace is the initial PID namespace's inode
// (PROC_PID_INIT_INO).
const hostPIDNamespace = 0xEFFFFFFC

// ErrPartialView: Live cannot list every namespace from here.
var ErrPartialView = errors.New("not in the host's PID namespace: the processes holding other network namespaces are not visible (run with hostPID)")

// Live returns the nsfs inodes of the network namespaces something on this
// node holds, as /proc shows them: a task's namespace, an open namespace
// file, and a bind mount of one in any mount namespace a process is in
// (how runtimes pin a pod's: /run/netns, /var/run/netns). A namespace kept
// only by a socket, or by a mount in a mount namespace no process is in,
// is not listed. It refuses (ErrPartialView) outside the host's PID
// namespace, where most holders are out of sight.
func Live() (map[uint64]bool, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return nil, fmt.Errorf("stat the PID namespace: %w", err)
	}
	if st.Ino != hostPIDNamespace {
		return nil, ErrPartialView
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var self unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		return nil, fmt.Errorf("stat the network namespace: %w", err)
	}
	live := map[uint64]bool{}
	add := func(link string) {
		// "net:[4026531840]"
		if rest, ok := strings.CutPrefix(link, "net:["); ok {
			if n, err := strconv.ParseUint(strings.TrimSuffix(rest, "]"), 10, 64); err == nil {
				live[n] = true
			}
		}
	}
	readlinks := func(dir, sub string) {
		entries, _ := os.ReadDir(dir) // a process may be gone: skip it
		for _, e := range entries {
			p := filepath.Join(dir, e.Name(), sub)
			l, err := os.Readlink(p)
			if err != nil {
				continue
			}
			add(l)
			// A file opened by path (/run/netns/NAME) shows the path:
			// an nsfs file is one on the namespaces' device.
			var st unix.Stat_t
			if strings.HasPrefix(l, "/") && unix.Stat(p, &st) == nil && st.Dev == self.Dev {
				live[st.Ino] = true
			}
		}
	}
	mountNS := map[uint64]bool{}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		dir := filepath.Join("/proc", p.Name())
		readlinks(filepath.Join(dir, "task"), "ns/net")
		readlinks(filepath.Join(dir, "fd"), "")
		var mst unix.Stat_t
		if unix.Stat(filepath.Join(dir, "ns/mnt"), &mst) != nil || mountNS[mst.Ino] {
			continue
		}
		mountNS[mst.Ino] = true
		nsfsMounts(filepath.Join(dir, "mountinfo"), add)
	}
	return live, nil
}

// nsfsMounts calls add with the root of every nsfs mount in a mountinfo
// file ("net:[N]" for a network namespace's bind mount).
func nsfsMounts(path string, add func(string)) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		line := sc.Text()
		i := strings.Index(line, " - ")
		if i < 0 || !strings.HasPrefix(line[i+3:], "nsfs ") {
			continue
		}
		if fields := strings.Fields(line[:i]); len(fields) > 3 {
			add(fields[3])
		}
	}
}
