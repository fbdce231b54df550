//go:build kernel

package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Profiling one measurement of a run with perf.
//
// With MESHWIRE_BENCH_PERF_CTL=DIR, each timed block of round trips
// (timedPingPong) of the fast-path and capture benchmarks is labelled
// "PLACEMENT/CONFIGURATION/PATH/BYTES B" (for example "one CPU/TPROXY + fast
// path, Istio pod/whole/64 B") and, when DIR holds a FIFO named after the
// label (perfCtlName: lower case, every run of other characters than a-z and
// 0-9 made one "-": "one-cpu-tproxy-fast-path-istio-pod-whole-64-b.ctl",
// with its ".ack" beside it), the benchmark writes "enable" to it before
// the block and "disable" after, each time waiting for the ".ack". That is
// perf's control protocol: a perf started disabled on those FIFOs records
// that block of every round and nothing else, e.g.
//
//	mkfifo DIR/NAME.ctl DIR/NAME.ack
//	perf record -a -g -C 1 -D -1 --control fifo:DIR/NAME.ctl,DIR/NAME.ack -o NAME.data &
//	MESHWIRE_BENCH_PERF_CTL=DIR make bench-fastpath ROUNDS=3
//
// (one perf per label to profile, all started before the benchmark; "-C
// 1" records the CPU of the "one CPU" placement on two CPUs). Without the
// variable, or with no FIFO for a label, nothing changes.
const perfCtlEnv = "MESHWIRE_BENCH_PERF_CTL"

// profiled runs fn, with the perf listening on label's FIFOs (if any)
// recording while it runs.
func profiled(b *testing.B, label string, fn func()) {
	dir := os.Getenv(perfCtlEnv)
	if dir == "" {
		fn()
		return
	}
	base := filepath.Join(dir, perfCtlName(label))
	if _, err := os.Stat(base + ".ctl"); err != nil {
		fn()
		return
	}
	perfCtl(b, base, "enable")
	defer perfCtl(b, base, "disable")
	fn()
}

// perfCtl sends cmd to the perf on base.ctl and waits for its ack.
func perfCtl(b *testing.B, base, cmd string) {
	ctl, err := os.OpenFile(base+".ctl", os.O_WRONLY, 0)
	if err != nil {
		b.Fatalf("%s: %v", perfCtlEnv, err)
	}
	defer ctl.Close()
	ack, err := os.OpenFile(base+".ack", os.O_RDONLY, 0)
	if err != nil {
		b.Fatalf("%s: %v", perfCtlEnv, err)
	}
	defer ack.Close()
	if _, err := fmt.Fprintln(ctl, cmd); err != nil {
		b.Fatalf("%s: write %s: %v", perfCtlEnv, base+".ctl", err)
	}
	_ = ack.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := bufio.NewReader(ack).ReadString('\n'); err != nil {
		b.Fatalf("%s: no ack from perf on %s: %v", perfCtlEnv, base+".ack", err)
	}
}
