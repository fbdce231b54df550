//go:build kernel

package loader

import (
	"os/exec"
	"testing"

	"github.com/meshwire/meshwire/internal/kerneltest"
)

// TestLockSharedThroughMounts: the attach/detach lock is on the bpffs
// mount, so a process in another mount namespace that sees it through a
// bind mount (a DaemonSet's container with the host's /sys/fs/bpf) waits
// for it.
func TestLockSharedThroughMounts(t *testing.T) {
	kerneltest.Require(t)
	if err := EnsureBPFFS(); err != nil {
		t.Fatal(err)
	}
	l, err := Lock()
	if err != nil {
		t.Fatal(err)
	}
	inContainer := func() error {
		mnt := t.TempDir()
		return exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
			"mount --bind "+LockDir+" "+mnt+" && flock --nonblock "+mnt+" true").Run()
	}
	if err := inContainer(); err == nil {
		t.Fatal("another mount namespace took the lock while it was held")
	}
	l.Release()
	if err := inContainer(); err != nil {
		t.Fatalf("another mount namespace could not take the free lock: %v", err)
	}
}
