// Package loader holds what the loaders of meshwire's BPF programs (the
// fast path, package fastpath, and ebpf interception, package capture)
// share on the node. That is the node-wide lock they attach and detach under,
// bpffs and cgroup v2 discovery, the layout versions and pin paths, the
// counters' reading and the errors for what the node lacks. Neither
// loader imports the other for it. It imports nothing of meshwire but
// low helpers (internal/filelock).
package loader

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshwire/meshwire/internal/filelock"
)

// LockDir serializes attach and detach on the node: an flock on the bpffs
// mount itself, which the host and a DaemonSet's container (with the
// host's /sys/fs/bpf mounted) share, as they share the pins; a file under
// /run is not shared. Nothing removes it.
var LockDir = BPFFS

// Lock takes the node-wide lock attach and detach hold, for every BPF
// program meshwire attaches.
func Lock() (*filelock.Lock, error) { return filelock.AcquireDir(LockDir, 30*time.Second) }

// LockToAttach checks what the programs need of the node (Supported,
// which mounts bpffs when absent: before the lock, which is on it), then
// takes the lock.
func LockToAttach() (*filelock.Lock, error) {
	if err := Supported(); err != nil {
		return nil, err
	}
	return Lock()
}

// ErrUnsupported wraps every failure that comes from what the kernel or the
// node lacks (as opposed to a bad flag or a failing command).
var ErrUnsupported = errors.New("the fast path cannot run here")

// Unsupported is an ErrUnsupported with a message.
func Unsupported(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, a...))
}

// FirstLines keeps the first n lines of s (a verifier log) on one line.
func FirstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, " | ")
}

// Result is what an attach did.
type Result int

const (
	// Attached: nothing was attached; now it is.
	Attached Result = iota
	// AlreadyAttached: this build's programs were attached with the same
	// settings; nothing changed.
	AlreadyAttached
	// Replaced: another build's programs (same layout, same settings)
	// were attached; they were detached and this build's attached.
	Replaced
)
