//go:build kernel

package bench

import (
	"fmt"
	"os"
	"testing"

	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/test/harness"
)

// TestMain takes the node-wide test lock and removes what a benchmark
// killed mid-run left (its namespaces, its fast path) before any
// benchmark starts: a run is never stopped or skewed by the last one.
func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		if err := kerneltest.Lock(); err != nil {
			fmt.Fprintf(os.Stderr, "waiting for other meshwire kernel tests: %v\n", err)
			os.Exit(1)
		}
		if dir := os.Getenv(harness.EnvBinDir); dir != "" {
			removed, err := harness.RemoveStale(dir)
			for _, r := range removed {
				fmt.Fprintf(os.Stderr, "removed, left by an earlier run: %s\n", r)
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "%v\n", err)
				os.Exit(1)
			}
		}
	}
	os.Exit(m.Run())
}
