package fwtext

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// Reads of legacy iptables without its tools: which tables the namespace
// loaded (/proc) and the chains of one (one getsockopt, as iptables-legacy
// itself reads a table). Everything here reads the calling thread's
// namespace.

// legacyTables lists the legacy iptables tables of fam the calling
// thread's namespace loaded (what iptables-legacy-save lists): the kernel
// instantiates a table on its first use, and one not listed holds
// nothing. No legacy iptables in the kernel reads as none. /proc/net is
// the thread group leader's namespace, not the one a thread entered:
// /proc/thread-self/net is read, with one open and one read (this is on
// every DEL's path).
func LegacyTables(fam ruleset.Family) ([]string, error) {
	path := "/proc/thread-self/net/ip_tables_names"
	if fam == ruleset.IP6 {
		path = "/proc/thread-self/net/ip6_tables_names"
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %v", path, err)
	}
	defer unix.Close(fd)
	// The built-in tables are few and short ("filter", "nat", "mangle",
	// "raw", "security"): one read holds them; a list that fills the
	// buffer is read on.
	var arr [256]byte
	buf := arr[:0]
	for {
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err != nil {
			return nil, fmt.Errorf("read %s: %v", path, err)
		}
		buf = buf[:len(buf)+n]
		if n == 0 || len(buf) < cap(buf) {
			break
		}
		buf = append(buf, 0)[:len(buf)] // grow
	}
	return strings.Fields(string(buf)), nil
}

// legacyTableLoaded tells whether the calling thread's namespace loaded
// the legacy iptables table (see legacyTables).
func LegacyTableLoaded(fam ruleset.Family, table string) (bool, error) {
	names, err := LegacyTables(fam)
	for _, n := range names {
		if n == table {
			return true, err
		}
	}
	return false, err
}

// legacyTablesLoaded: the namespace loaded a legacy iptables table of fam
// (unreadable reads as none).
func LegacyTablesLoaded(fam ruleset.Family) bool {
	names, _ := LegacyTables(fam)
	return len(names) > 0
}

// legacyHooks names iptables' built-in chains by netfilter hook number.
var legacyHooks = [...]string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}

// legacyChainNames returns the chains of legacy iptables' table of family
// f, read with one getsockopt (IPT_SO_GET_INFO, then IPT_SO_GET_ENTRIES;
// no tool started): the built-in chains in hook order, then the user
// chains in the table's order. A table the namespace never loaded is not
// read (reading it would instantiate it): nil, nil.
func LegacyChainNames(f ruleset.IPVersion, table string) ([]string, error) {
	if len(table) >= 32 {
		return nil, fmt.Errorf("legacy iptables: table name %q too long", table)
	}
	level, domain := unix.IPPROTO_IP, unix.AF_INET
	// struct ipt_entry: target_offset and next_offset follow struct ipt_ip
	// (84 bytes) and nfcache.
	offTarget := 88
	if f == ruleset.V6 {
		level, domain = unix.IPPROTO_IPV6, unix.AF_INET6
		offTarget = 140 // struct ip6t_ip6 is 136 bytes
	}
	loaded, err := LegacyTableLoaded(f.Tables(), table)
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
	for attempt := 0; ; attempt++ {
		// struct ipt_getinfo: name[32], valid_hooks, hook_entry[5],
		// underflow[5], num_entries, size.
		var info [84]byte
		copy(info[:], table)
		if err := getsockopt(fd, level, soGetInfo, info[:]); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil, nil
			}
			return nil, fmt.Errorf("legacy iptables %s info: %v", table, err)
		}
		hooks := binary.NativeEndian.Uint32(info[32:36])
		size := binary.NativeEndian.Uint32(info[80:84])
		// struct ipt_get_entries: name[32], size, then the entries at
		// offset 40 (8-byte aligned for their counters).
		const entriesOff = 40
		buf := make([]byte, entriesOff+int(size))
		copy(buf, table)
		binary.NativeEndian.PutUint32(buf[32:36], size)
		if err := getsockopt(fd, level, soGetEntries, buf); err != nil {
			if errors.Is(err, unix.EAGAIN) && attempt < 3 {
				continue // the table changed between the two calls
			}
			return nil, fmt.Errorf("legacy iptables %s entries: %v", table, err)
		}
		var names []string
		for h, name := range legacyHooks {
			if hooks&(1<<h) != 0 {
				names = append(names, name)
			}
		}
		return ErrorTargets(names, buf[entriesOff:], offTarget)
	}
}

// errorTargets walks the entries of a table blob and appends to names
// the names that ERROR targets carry: the heads of user chains (the
// blob's final "ERROR" entry is left out).
func ErrorTargets(names []string, blob []byte, offTarget int) ([]string, error) {
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
				names = append(names, name)
			}
		}
		off += next
	}
	return names, nil
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
