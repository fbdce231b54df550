package framework

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSampleCPU: this process's own CPU time shows in procCPU after it
// spends some, and the machine's busy time grows with it (to a few
// ticks).
func TestSampleCPU(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	before, mBefore := procCPU(pid, false), machineBusy()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	spent, mSpent := procCPU(pid, false)-before, machineBusy()-mBefore
	if spent < 0.1 || spent > 1 {
		t.Errorf("300 ms of spinning read as %.2f s of this process's CPU", spent)
	}
	// Both count in clock ticks (10 ms), the process's scaled from its
	// exact run time and the machine's per tick as it comes: a few
	// ticks apart.
	if mSpent < spent-0.05 {
		t.Errorf("the machine's busy time grew %.2f s, less than this process's %.2f s", mSpent, spent)
	}
	if got := CPULine(map[string]float64{"machine": 2, "kubelet": 0.5, "containerd": 1}); got != "2.0 s on the machine, containerd 1.0, kubelet 0.5" {
		t.Errorf("CPULine: %q", got)
	}
}

// TestContainersCPU: container cgroups are found at the root and under
// pod cgroups, their descendants and other cgroups' own usage left out;
// the delta counts the containers of both samples only.
func TestContainersCPU(t *testing.T) {
	root := t.TempDir()
	id := func(c byte) string { return strings.Repeat(string(c), 64) }
	write := func(dir, usage string) {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dir, "cpuacct.usage"), []byte(usage+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(".", "999000000000")                      // the root: not a container
	write(id('a'), "1500000000")                    // a container at the root
	write("kubepods/pod1234/"+id('b'), "250000000") // under a pod's cgroup
	write(id('a')+"/"+id('c'), "7000000000")        // inside a container: its own
	write("kubelet.slice", "5000000000")            // another cgroup
	got, err := containersCPU(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[filepath.Join(root, id('a'))] != 1.5 || got[filepath.Join(root, "kubepods/pod1234", id('b'))] != 0.25 {
		t.Errorf("containersCPU: %v", got)
	}
	after := map[string]float64{"a": 2.5, "b": 1, "new": 9}
	if d := PodsCPUDelta(map[string]float64{"a": 1.5, "b": 0.25, "gone": 3}, after); d != 1.75 {
		t.Errorf("PodsCPUDelta %v, want 1.75", d)
	}
	if _, err := containersCPU(t.TempDir()); err == nil {
		t.Error("no container cgroup, no error")
	}
}
