// Package filelock is the lock that processes on a node take around what
// they share: host-local's address store (AcquireQueued), portmap's
// slow paths, the meshwire command's state directory and the eBPF fast
// path's attach and detach (Acquire). It is an flock(2) on a file, so it
// dies with the process that holds it (a kill -9 never leaves a stale
// lock), taken with a bound so that a stuck holder ends in CNI error code 11
// (try again later) instead of a hung runtime.
package filelock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// DefaultTimeout is how long Lock waits before giving up with code 11.
const DefaultTimeout = 10 * time.Second

// Lock is a held lock.
type Lock struct{ f *os.File }

// Acquire takes an exclusive lock on path (creating it and its directory),
// waiting at most timeout.
func Acquire(path string, timeout time.Duration) (*Lock, error) {
	return acquire(path, timeout, unix.LOCK_EX)
}

// AcquireDir takes an exclusive lock on the directory dir itself, which
// must exist: for a lock shared through a directory that two mount
// namespaces both see (bpffs, mounted into a DaemonSet's container), on a
// file system where no regular file can be created. Nothing may remove
// dir while it is in use as a lock.
func AcquireDir(dir string, timeout time.Duration) (*Lock, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return wait(f, dir, timeout, unix.LOCK_EX)
}

func acquire(path string, timeout time.Duration, how int) (*Lock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return wait(f, path, timeout, how)
}

// wait takes the flock on f, polling until timeout; it closes f when it
// fails.
func wait(f *os.File, path string, timeout time.Duration, how int) (*Lock, error) {
	deadline := time.Now().Add(timeout)
	wait := 200 * time.Microsecond
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return &Lock{f: f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, cnierr.TryAgain("lock %s is held by another process for more than %s; try again later", path, timeout)
		}
		time.Sleep(wait)
		if wait < 20*time.Millisecond {
			wait *= 2
		}
	}
}

// Release drops the lock. It is safe to call on nil and more than once.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	_ = l.f.Close()
	l.f = nil
}
