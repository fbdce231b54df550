package netns

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Identify returns the inode and device of the namespace at path: what a
// record of a pod's namespace keeps, so that a path that later leads
// elsewhere (a name reused, a pid's path after the pid went) is not taken
// for the pod's.
func Identify(path string) (ino, dev uint64, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, fmt.Errorf("stat %s: no inode", path)
	}
	return st.Ino, st.Dev, nil
}

// ErrNotThePod: a recorded namespace path no longer leads to the pod's
// namespace, or leads to the namespace of the process itself (the host's,
// for the node agent): rules installed there would capture what is not
// the pod's.
var ErrNotThePod = errors.New("the recorded namespace path no longer leads to the pod's namespace")

// CheckIdentity tells whether path still leads to the namespace of inode
// ino on device dev, and not to this process's own.
func CheckIdentity(path string, ino, dev uint64) error {
	got, gotDev, err := Identify(path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotThePod, err)
	}
	if got != ino || gotDev != dev {
		return ErrNotThePod
	}
	if self, selfDev, err := Identify("/proc/self/ns/net"); err != nil || (self == got && selfDev == gotDev) {
		return ErrNotThePod
	}
	return nil
}
