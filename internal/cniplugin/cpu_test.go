package cniplugin

import (
	"crypto/sha256"
	"testing"
)

// cpuMs counts this process's CPU time: it grows with work done.
func TestCPUMsGrows(t *testing.T) {
	before := cpuMs()
	if before < 0 {
		t.Fatalf("cpuMs() = %v", before)
	}
	buf := make([]byte, 1<<20)
	for i := 0; i < 200; i++ {
		sum := sha256.Sum256(buf)
		buf[0] = sum[0]
	}
	if after := cpuMs(); after <= before {
		t.Errorf("cpuMs() went from %v to %v after 200 MiB of hashing", before, after)
	}
}
