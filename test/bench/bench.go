// Package bench holds meshwire's benchmarks: the built binaries run the way
// a runtime runs them, side by side in the same run with two peers, the
// newest reference plugins (v1.9.1, built by the benchmarks from the Go
// module proxy) and Debian's older 1.1.1 (/usr/lib/cni), taking turns in
// rotating order on a settled machine, reporting medians and ratios against
// each peer as markdown tables (`make bench`).
package bench

import (
	"math"
	"time"
)

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
