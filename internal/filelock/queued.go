package filelock

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// AcquireQueued takes an exclusive lock like Acquire, but waits in the
// kernel's queue (a blocking flock) instead of polling: when the holder
// releases, a waiter gets the lock at once. Under heavy contention (a
// runtime starting hundreds of pods on a node) polling leaves the lock idle
// between holders; a queued wait keeps it busy. Past timeout it fails with
// code 11 like Acquire; a wait given up on is released as soon as the kernel
// grants it, so a process that goes on after the timeout does not keep a
// lock it never used.
func AcquireQueued(path string, timeout time.Duration) (*Lock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		return &Lock{f: f}, nil
	}
	var mu sync.Mutex
	abandoned := false
	done := make(chan error, 1)
	go func() {
		var err error
		for {
			if err = unix.Flock(int(f.Fd()), unix.LOCK_EX); err != unix.EINTR {
				break
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			if err == nil {
				_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			}
			_ = f.Close()
			return
		}
		done <- err
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return queuedResult(f, path, err)
	case <-timer.C:
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case err := <-done: // granted just as the time ran out
		return queuedResult(f, path, err)
	default:
		abandoned = true
	}
	return nil, cnierr.TryAgain("lock %s is held by another process for more than %s; try again later", path, timeout)
}

func queuedResult(f *os.File, path string, err error) (*Lock, error) {
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}
