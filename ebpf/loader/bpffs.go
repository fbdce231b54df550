package loader

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BPFFS is where bpffs is mounted when absent.
const BPFFS = "/sys/fs/bpf"

// Supported checks what the programs need of the node before anything is
// changed: kernel BTF (CO-RE), bpffs (mounted here when absent) and cgroup v2.
func Supported() error {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return Unsupported("kernel BTF (/sys/kernel/btf/vmlinux) is missing: the programs read socket fields through CO-RE, which needs a kernel built with CONFIG_DEBUG_INFO_BTF")
	}
	if err := EnsureBPFFS(); err != nil {
		return err
	}
	if _, err := Cgroup2Root(); err != nil {
		return err
	}
	return nil
}

// EnsureBPFFS mounts bpffs at BPFFS unless it is mounted there.
func EnsureBPFFS() error {
	var st unix.Statfs_t
	if err := unix.Statfs(BPFFS, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(BPFFS, 0o755); err != nil {
		return Unsupported("create %s: %v", BPFFS, err)
	}
	if err := unix.Mount("bpf", BPFFS, "bpf", 0, "mode=0700"); err != nil {
		return Unsupported("mount bpffs on %s: %v", BPFFS, err)
	}
	return nil
}

// RemovePins removes the pin directory and what is pinned in it (an unpin
// is a file removal on bpffs), and the parent when it is left empty.
func RemovePins(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove the pins in %s: %w", dir, err)
	}
	_ = os.Remove(filepath.Dir(dir)) // only when empty
	return nil
}

// OtherLayout returns a directory beside dir under root (the directory of
// every layout version's pins) for which attached is true, when dir is
// under root.
func OtherLayout(root, dir string, attached func(string) bool) (string, bool) {
	dir = filepath.Clean(dir)
	if filepath.Dir(dir) != root {
		return "", false
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		other := filepath.Join(root, e.Name())
		if other != dir && attached(other) {
			return other, true
		}
	}
	return "", false
}

// SumCounters reads the first n counters of the pinned per-CPU array at
// path, each summed over the CPUs (the fast path's and the ebpf
// interception programs' counters).
func SumCounters(path string, n int) ([]uint64, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("open the pinned counters: %w", err)
	}
	defer m.Close()
	sum := make([]uint64, n)
	for i := range sum {
		if uint32(i) >= m.MaxEntries() {
			break // an earlier build's programs, with fewer counters
		}
		var perCPU []uint64
		if err := m.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("read counter %d: %w", i, err)
		}
		for _, v := range perCPU {
			sum[i] += v
		}
	}
	return sum, nil
}
