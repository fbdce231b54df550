//go:build kernel

package netns_test

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/vishvananda/netlink"
)

// TestCreateDelete needs root: it makes a real namespace in a private run
// directory.
func TestCreateDelete(t *testing.T) {
	kerneltest.Require(t)
	old := netns.RunDir
	netns.RunDir = t.TempDir()
	defer func() { netns.RunDir = old }()
	p, err := netns.Create("mwt-unit")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete("mwt-unit") })
	if !netns.IsNetNS(p) || !netns.Exists("mwt-unit") {
		t.Fatal("created namespace is not a namespace mount")
	}
	if _, err := netns.Create("mwt-unit"); !errors.Is(err, netns.ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	names, err := netns.List()
	if err != nil || len(names) != 1 || names[0] != "mwt-unit" {
		t.Fatalf("List = %v, %v", names, err)
	}
	entered := false
	if err := netns.Enter(p, func() error { entered = true; return nil }); err != nil || !entered {
		t.Fatalf("Enter: %v", err)
	}
	if err := netns.Delete("mwt-unit"); err != nil {
		t.Fatal(err)
	}
	if netns.Exists("mwt-unit") {
		t.Fatal("still there after Delete")
	}
	if err := netns.Delete("mwt-unit"); err != nil {
		t.Fatalf("Delete of a missing namespace: %v", err)
	}
	err = netns.Enter(p, func() error { return nil })
	if !netns.IsGone(err) {
		t.Fatalf("Enter of a deleted namespace: %v, want IsGone", err)
	}
}

// TestCreateLeavesNoThreadBehind: Create switches one thread into the new
// namespace to mount it; afterwards every thread of the process must be
// back in the original namespace (a thread left behind would keep the
// namespace, and its links, alive after Delete, and could run other
// goroutines there).
func TestCreateLeavesNoThreadBehind(t *testing.T) {
	kerneltest.Require(t)
	old := netns.RunDir
	netns.RunDir = t.TempDir()
	defer func() { netns.RunDir = old }()
	self, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ {
		name := fmt.Sprintf("mwt-thread-%d", i)
		if _, err := netns.Create(name); err != nil {
			t.Fatal(err)
		}
		if err := netns.Delete(name); err != nil {
			t.Fatal(err)
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		l, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/net")
		if err == nil && l != self {
			t.Errorf("thread %s is in %s, not the original %s", task.Name(), l, self)
		}
	}
}

// TestOpenStillThere needs root: it opens a real namespace, reads its
// loopback through the handle, and sees the namespace go.
func TestOpenStillThere(t *testing.T) {
	kerneltest.Require(t)
	old := netns.RunDir
	netns.RunDir = t.TempDir()
	defer func() { netns.RunDir = old }()
	p, err := netns.Create("mwt-open")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete("mwt-open") })
	ns, err := netns.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	lo, err := ns.NL.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.NL.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	addrs, err := ns.NL.AddrList(lo, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IP.String() != "127.0.0.1" {
		t.Fatalf("addresses of lo in the namespace: %v, %v", addrs, err)
	}
	if err := ns.StillThere(p); err != nil {
		t.Fatalf("StillThere on a live namespace: %v", err)
	}
	if err := netns.Delete("mwt-open"); err != nil {
		t.Fatal(err)
	}
	if err := ns.StillThere(p); cnierr.Code(err) != cnierr.CodeInvalidEnv {
		t.Fatalf("StillThere after delete: %v", err)
	}
}

// TestLive: Live lists a namespace while a bind mount holds it, and while
// only an open file does, and not once neither does; the test's own
// namespace (its threads') is listed.
func TestLive(t *testing.T) {
	kerneltest.Require(t)
	old := netns.RunDir
	netns.RunDir = t.TempDir()
	defer func() { netns.RunDir = old }()
	p, err := netns.Create("mwt-live")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete("mwt-live") })
	var ino uint64
	if err := netns.Enter(p, func() (err error) { ino, err = netns.Inode(); return err }); err != nil {
		t.Fatal(err)
	}
	self, err := netns.Inode()
	if err != nil {
		t.Fatal(err)
	}
	live := func() map[uint64]bool {
		t.Helper()
		l, err := netns.Live()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := live(); !l[ino] || !l[self] {
		t.Fatalf("Live with the namespace mounted at %s: has it %v, has the test's own %v", p, l[ino], l[self])
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Delete("mwt-live"); err != nil {
		t.Fatal(err)
	}
	if !live()[ino] {
		t.Fatal("Live misses a namespace held only by an open file")
	}
	f.Close()
	if live()[ino] {
		t.Fatal("Live lists a namespace nothing holds any more")
	}
}
