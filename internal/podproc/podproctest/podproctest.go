// Package podproctest runs processes the way kubelet places a pod's
// containers, for tests of podproc.Find and of what uses it. Each runs
// in a cgroup named after its container, below one named after the pod's
// uid (kubelet's cgroupfs driver) or directly under containerd's (kubelet
// with cgroupsPerQOS false), in a given network namespace.
package podproctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Cgroups is a tree of cgroups of the test's own under a cgroup mount,
// removed when the test ends (after its processes).
type Cgroups struct {
	t          testing.TB
	root, base string
	dirs       []string
}

// New makes the test's cgroup tree under root, a cgroup mount (the
// cgroup2 one: loader.Cgroup2Root).
func New(t testing.TB, root string) *Cgroups {
	t.Helper()
	c := &Cgroups{t: t, root: root, base: filepath.Join(root, fmt.Sprintf("meshwire-test-%s-%d", filepath.Base(t.Name()), os.Getpid()))}
	t.Cleanup(func() {
		for i := len(c.dirs) - 1; i >= 0; i-- {
			_ = os.Remove(c.dirs[i])
		}
	})
	return c
}

// Process is a process Start started.
type Process struct{ cmd *exec.Cmd }

// Kill ends the process and waits for it (again: nothing).
func (p *Process) Kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// Start runs a process of pod uid's container id, in the namespace at
// nsPath ("" for the test's own), in the pod's cgroup (uid "": in
// containerd's, k8s.io); it is killed when the test ends.
func (c *Cgroups) Start(uid, id, nsPath string) *Process {
	t := c.t
	t.Helper()
	dir := filepath.Join(c.base, "k8s.io", id)
	if uid != "" {
		dir = filepath.Join(c.base, "kubepods", "besteffort", "pod"+uid, id)
	}
	var made []string
	for d := dir; d != c.root; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		made = append([]string{d}, made...)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c.dirs = append(c.dirs, made...)
	args := []string{"sleep", "600"}
	if nsPath != "" {
		args = append([]string{"nsenter", "--net=" + nsPath}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Process{cmd: cmd}
	t.Cleanup(p.Kill)
	pid := cmd.Process.Pid
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	// nsenter has entered the namespace once it runs sleep.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); filepath.Base(exe) == "sleep" {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatal("the pod's process did not start")
		}
	}
}
