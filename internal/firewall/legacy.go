package firewall

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// legacyChains returns the user chains of legacy iptables' table of
// family f, read with one getsockopt (no tool started): the cheap check of
// DEL on a node whose legacy nat table exists. A nat table that was never
// loaded in this namespace holds nothing and is not loaded by the check
// (reading it would instantiate it): nil, nil. The calling thread's
// namespace is the one read.
func legacyChains(f Family, table string) (map[string]bool, error) {
	names, level, domain := "/proc/thread-self/net/ip_tables_names", unix.IPPROTO_IP, unix.AF_INET
	// struct ipt_entry: target_offset and next_offset follow struct ipt_ip
	// (84 bytes) and nfcache.
	offTarget := 88
	if f == V6 {
		names, level, domain = "/proc/thread-self/net/ip6_tables_names", unix.IPPROTO_IPV6, unix.AF_INET6
		offTarget = 140 // struct ip6t_ip6 is 136 bytes
	}
	loaded, err := listsTable(names, table)
	if err != nil || !loaded {
		return nil, err
	}
	fd, err := unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, fmt.Errorf("legacy iptables: %v", err)
	}
	defer unix.Close(fd)

	// IPT_SO_GET_INFO (64) then IPT_SO_GET_ENTRIES (65); the ip6t_ ones
	// have the same numbers and layouts where it matters here.
	const soGetInfo, soGetEntries = 64, 65
	var info [84]byte // struct ipt_getinfo
	copy(info[:], table)
	if err := getsockopt(fd, level, soGetInfo, info[:]); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("legacy iptables nat info: %v", err)
	}
	size := binary.NativeEndian.Uint32(info[80:84])
	// struct ipt_get_entries: name[32], size, then the entries at offset
	// 40 (8-byte aligned for their counters).
	const entriesOff = 40
	buf := make([]byte, entriesOff+int(size))
	copy(buf, table)
	binary.NativeEndian.PutUint32(buf[32:36], size)
	if err := getsockopt(fd, level, soGetEntries, buf); err != nil {
		// EAGAIN: the table changed between the two calls.
		return nil, fmt.Errorf("legacy iptables nat entries: %v", err)
	}
	return errorTargets(buf[entriesOff:], offTarget)
}

// errorTargets walks the entries of a table blob and returns the names
// that ERROR targets carry: the heads of user chains (and the blob's
// final "ERROR" entry, left out).
func errorTargets(blob []byte, offTarget int) (map[string]bool, error) {
	chains := map[string]bool{}
	for off := 0; off < len(blob); {
		if off+offTarget+4 > len(blob) {
			return nil, fmt.Errorf("legacy iptables: truncated entry at %d", off)
		}
		tOff := int(binary.NativeEndian.Uint16(blob[off+offTarget:]))
		next := int(binary.NativeEndian.Uint16(blob[off+offTarget+2:]))
		if next <= 0 || off+next > len(blob) || tOff+32 > next {
			return nil, fmt.Errorf("legacy iptables: bad entry at %d", off)
		}
		// struct xt_entry_target: u16 target_size, char name[29],
		// u8 revision, then the target's data.
		t := blob[off+tOff : off+next]
		if cstring(t[2:31]) == "ERROR" {
			if name := cstring(t[32:]); name != "" && name != "ERROR" {
				chains[name] = true
			}
		}
		off += next
	}
	return chains, nil
}

// listsTable reads a proc file of table names (one open, one read: this is
// on every DEL's path) and tells whether it lists table.
func listsTable(path, table string) (bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return false, nil // no legacy iptables in this kernel
	}
	if err != nil {
		return false, fmt.Errorf("open %s: %v", path, err)
	}
	defer unix.Close(fd)
	var buf [256]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil {
		return false, fmt.Errorf("read %s: %v", path, err)
	}
	// Built-in tables are few ("filter", "nat", "mangle", "raw",
	// "security"); a list that fills the buffer ends in a cut name, which
	// the line test skips.
	return hasLine(string(buf[:n]), table), nil
}

func getsockopt(fd, level, opt int, b []byte) error {
	l := uint32(len(b))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func hasLine(s, line string) bool {
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}
