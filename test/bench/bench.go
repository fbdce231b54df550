// Package bench holds meshwire's benchmarks: the built binaries run the way
// a runtime runs them, side by side in the same run with two peers, the
// newest reference plugins (v1.9.1, built by the benchmarks from the Go
// module proxy) and Debian's older 1.1.1 (/usr/lib/cni), taking turns in
// rotating order on a settled machine, reporting medians and ratios against
// each peer as markdown tables (`make bench`).
package bench

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// benchRoundsEnv sets the number of rounds of the fast-path and EBPF-mode
// benchmarks (each configuration runs once per placement per round).
const benchRoundsEnv = "MESHWIRE_BENCH_ROUNDS"

// parseRounds reads MESHWIRE_BENCH_ROUNDS: 10 when unset.
func parseRounds(v string) (int, error) {
	if v == "" {
		return 10, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%q: want a positive number of rounds", v)
	}
	return n, nil
}

func fastpathBenchUs(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }

// verdict is a target's result as the benchmarks print it.
func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

// gapClosed is how much of the way from redir (the rules alone) to none
// (no interception) d went: 1 at none, 0 at redir, negative beyond it;
// ok is false when redir and none are the same, where it means nothing.
func gapClosed(d, redir, none time.Duration) (closed float64, ok bool) {
	redirGap := math.Abs(float64(redir - none))
	if redirGap == 0 {
		return 0, false
	}
	return 1 - math.Abs(float64(d-none))/redirGap, true
}

// floatMedian is the median of per-round values (the lower one of an even
// count, as harness.Samples).
func floatMedian(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	c := slices.Clone(v)
	slices.Sort(c)
	return c[(len(c)-1)/2]
}

// gapFigure is d against the way from redir to none, and whether it went
// at least min of it.
func gapFigure(d, redir, none time.Duration, min float64) (string, bool) {
	c, ok := gapClosed(d, redir, none)
	closed := "n/a"
	if ok {
		closed = fmt.Sprintf("%.0f%%", 100*c)
	}
	return fmt.Sprintf("%s of the way (%s µs; none %s, REDIRECT %s)", closed, fastpathBenchUs(d), fastpathBenchUs(none), fastpathBenchUs(redir)), ok && c >= min
}

// cpuFigure is a CPU time per request against REDIRECT's, and whether it
// is at most max times it.
func cpuFigure(d, redir time.Duration, max float64) (string, bool) {
	if redir == 0 {
		return "n/a", false
	}
	r := float64(d) / float64(redir)
	return fmt.Sprintf("%.2fx (%s vs %s CPU µs per request)", r, fastpathBenchUs(d), fastpathBenchUs(redir)), r <= max
}

// perfCtlName is the file name (without .ctl/.ack) of the FIFOs of a
// profiled block's label (perfctl_bench_test.go): lower case, every run of
// other characters than a-z and 0-9 made one "-", none at either end, as
// test/bench/perfblocks.sh names them.
func perfCtlName(label string) string {
	var s strings.Builder
	dash := false
	for _, r := range strings.ToLower(label) {
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') {
			s.WriteRune(r)
			dash = false
		} else if !dash && s.Len() > 0 {
			s.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(s.String(), "-")
}
