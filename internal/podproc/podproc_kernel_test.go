//go:build kernel

package podproc_test

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/podproc"
	"github.com/meshwire/meshwire/internal/podproc/podproctest"
)

// TestFind: a pod's processes, in cgroups named as kubelet's cgroupfs
// driver names them, or only after their containers, and in a namespace
// mounted where runtimes mount them, lead Find to the namespace's path
// and to the sandbox, the first process started in it; a process of the
// pod in the host's namespace (a host-network pod) and another pod's
// processes are not taken.
func TestFind(t *testing.T) {
	kerneltest.Require(t)
	const uid, other = "0b8f9c1e-4d2a-4f7e-9a61-5c3d2e1f0a9b", "1b8f9c1e-4d2a-4f7e-9a61-5c3d2e1f0a9b"
	name := fmt.Sprintf("mwt-find-%d", os.Getpid())
	path, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete(name) })
	root, err := loader.Cgroup2Root()
	if err != nil {
		t.Fatal(err)
	}
	cg := podproctest.New(t, root)
	if _, err := podproc.Find(uid, nil); !errors.Is(err, podproc.ErrNotFound) {
		t.Fatalf("no process yet: %v", err)
	}
	cg.Start(uid, "hostnet", "") // in the pod's cgroup, the host's namespace
	if _, err := podproc.Find(uid, nil); !errors.Is(err, podproc.ErrNotFound) {
		t.Fatalf("a process in the host's namespace only: %v", err)
	}
	cg.Start(uid, "sandbox0123", path)
	cg.Start(uid, "app4567", path)
	cg.Start(other, "x", path)
	got, err := podproc.Find(uid, nil)
	if err != nil {
		t.Fatal(err)
	}
	// (/var/run is /run here: either path is the namespace.)
	ino, dev, _ := netns.Identify(path)
	if netns.CheckIdentity(got.Netns, ino, dev) != nil || got.ContainerID != "sandbox0123" {
		t.Fatalf("found %+v, want %s and the sandbox", got, path)
	}
	if _, err := podproc.Find("2b8f9c1e-4d2a-4f7e-9a61-5c3d2e1f0a9b", nil); !errors.Is(err, podproc.ErrNotFound) {
		t.Fatalf("another uid: %v", err)
	}

	// No pod cgroups (kubelet's cgroupsPerQOS false): each container's
	// cgroup under containerd's, the pod's found by its containers' ids,
	// its sandbox by its namespace.
	name2 := name + "-flat"
	path2, err := netns.Create(name2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete(name2) })
	cg.Start("", "flatsandbox", path2)
	cg.Start("", "flatapp", path2)
	cg.Start("", "flatother", path)
	const flat = "3b8f9c1e-4d2a-4f7e-9a61-5c3d2e1f0a9b"
	if _, err := podproc.Find(flat, []string{"nothere"}); !errors.Is(err, podproc.ErrNotFound) {
		t.Fatalf("containers not running: %v", err)
	}
	got, err = podproc.Find(flat, []string{"flatapp"})
	if err != nil {
		t.Fatal(err)
	}
	ino, dev, _ = netns.Identify(path2)
	if netns.CheckIdentity(got.Netns, ino, dev) != nil || got.ContainerID != "flatsandbox" {
		t.Fatalf("found %+v, want %s and its sandbox", got, path2)
	}
}
