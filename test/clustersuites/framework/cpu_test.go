package framework

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// TestSampleCPU: this process's own CPU time shows in procCPU after it
// spends some, and the machine's busy time grows with it.
func TestSampleCPU(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	before, mBefore := procCPU(pid, false), machineBusy()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	spent, mSpent := procCPU(pid, false)-before, machineBusy()-mBefore
	if spent < 0.1 || spent > 1 {
		t.Errorf("300 ms of spinning read as %.2f s of this process's CPU", spent)
	}
	if mSpent < spent {
		t.Errorf("the machine's busy time grew %.2f s, less than this process's %.2f s", mSpent, spent)
	}
	if got := CPULine(map[string]float64{"machine": 2, "kubelet": 0.5, "containerd": 1}); got != "2.0 s on the machine, containerd 1.0, kubelet 0.5" {
		t.Errorf("CPULine: %q", got)
	}
}
