// Package kerneltest is the one door of meshwire's kernel tests: the tests
// that create network namespaces, links, firewall rules or BPF objects,
// run firewall tools or read the host's state. They live in files built
// with the "kernel" tag (`//go:build kernel`), which `make test` and
// `make bench` set and `make unit` does not, and each starts with Require:
// without root it fails (CI runs as root, so a kernel test never passes by
// skipping), and it takes the node-wide test lock, so that kernel tests of
// different packages never run at the same time (a test that snapshots
// the host for leaks must not see another's links and rules come and go).
package kerneltest

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/filelock"
)

// LockFile is the node-wide lock of kernel tests.
const LockFile = "/run/meshwire-tests.lock"

var (
	once sync.Once
	// held stays referenced for the life of the process: an unreachable
	// *os.File is closed by its finalizer at the next garbage collection,
	// which would drop the flock long before the tests end.
	held    *filelock.Lock
	lockErr error
)

// Require fails t unless the process runs as root, then takes the
// node-wide lock, once per test process (held until the process exits:
// the kernel drops an flock with its holder).
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("a kernel test (network namespaces, links, firewall, BPF) must run as root: run `make test` as root; `make unit` leaves it out")
	}
	if err := Lock(); err != nil {
		t.Fatalf("waiting for other meshwire kernel tests: %v", err)
	}
}

// Lock takes the node-wide lock once per process, as Require does, for a
// TestMain that cleans up before any test runs.
//
// With MESHWIRE_KERNEL_LOCK_HELD=1 in the environment, the caller says it
// holds the lock already for this process and its children (a script
// that runs several suites under one `flock`), and Lock takes nothing.
func Lock() error {
	if os.Getenv(EnvLockHeld) == "1" {
		return nil
	}
	file := LockFile
	if f := os.Getenv(EnvPackageLock); f != "" {
		file = f
	}
	once.Do(func() { held, lockErr = filelock.Acquire(file, 60*time.Minute) })
	return lockErr
}

// EnvLockHeld names the variable that says the caller holds LockFile.
const EnvLockHeld = "MESHWIRE_KERNEL_LOCK_HELD"

// EnvPackageLock names the variable of a run that holds LockFile for its
// whole length (make test: the host's seed goes in and out under it, so
// that no cluster or benchmark starts in between and sees it): the test
// processes it starts take this file's lock instead, one at a time.
const EnvPackageLock = "MESHWIRE_KERNEL_PACKAGE_LOCK"
