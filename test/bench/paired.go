package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// The fast-path and EBPF-mode targets are judged on paired figures. In
// every round each configuration runs beside the baseline it is compared
// with (REDIRECT alone, no interception), in the same placement and
// within minutes of it, so whatever state the machine is in that round
// moves both. A round therefore gives one figure of its own (the
// configuration's round-trip median over the baseline's, or its share of
// the way from REDIRECT to no interception), and a target is judged on the
// median of those per-round figures, shown with their min–max and how many
// rounds met the target alone. Against a ratio of medians taken over
// different rounds, a few slow rounds of the baseline or of the
// configuration cannot flip it.
//
// The rounds of one configuration on one CPU also fall into two groups on
// these VMs (a fast and a slow one, minutes apart: docs/fastpath.md), so
// beside each judged figure the configuration's and the baseline's rounds
// are split in two, each group with its median and its share of rounds.

// limit is a target on a paired figure.
type limit struct {
	value  float64
	atMost bool // the figure is at most value (else at least)
	share  bool // a share of the way, printed in %
	plain  bool // a count, printed as 0.00; else a ratio, printed as 0.00x
}

func atMost(v float64) limit  { return limit{value: v, atMost: true} }
func atLeast(v float64) limit { return limit{value: v} }
func shareAtLeast(v float64) limit {
	return limit{value: v, share: true}
}

func (l limit) holds(v float64) bool {
	if l.atMost {
		return v <= l.value
	}
	return v >= l.value
}

func (l limit) format(v float64) string {
	switch {
	case l.share:
		return fmt.Sprintf("%.0f%%", 100*v)
	case l.plain:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.2fx", v)
}

// perRound is one figure per round, in round order.
type perRound []float64

// pairedRatios is x over base, round by round (a round whose base is 0
// gives none).
func pairedRatios(x, base []float64) perRound {
	var out perRound
	for k := 0; k < min(len(x), len(base)); k++ {
		if base[k] != 0 {
			out = append(out, x[k]/base[k])
		}
	}
	return out
}

// pairedGaps is, round by round, how much of the way from redir to none
// x went (gapClosed; a round where the two are equal gives none).
func pairedGaps(x, redir, none []float64) perRound {
	var out perRound
	for k := 0; k < min(len(x), len(redir), len(none)); k++ {
		if c, ok := gapClosed(time.Duration(x[k]*1e3), time.Duration(redir[k]*1e3), time.Duration(none[k]*1e3)); ok {
			out = append(out, c)
		}
	}
	return out
}

// judgement is a target judged on per-round figures.
type judgement struct {
	median, lo, hi float64
	within, n      int  // rounds whose own figure met the limit, of n
	ok             bool // the median meets the limit
}

func (p perRound) judge(l limit) judgement {
	if len(p) == 0 {
		return judgement{}
	}
	j := judgement{median: median(p), lo: slices.Min(p), hi: slices.Max(p), n: len(p)}
	for _, v := range p {
		if l.holds(v) {
			j.within++
		}
	}
	j.ok = l.holds(j.median)
	return j
}

// median is the median of v: of an even count, the mean of the two middle
// values (floatMedian takes the lower one, which would favour an "at
// most" target and disfavour an "at least" one).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// cell is "median [min–max]" in l's unit.
func (j judgement) cell(l limit) string {
	if j.n == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%s [%s–%s]", l.format(j.median), l.format(j.lo), l.format(j.hi))
}

func (j judgement) rounds() string { return fmt.Sprintf("%d/%d", j.within, j.n) }

// group is some of a figure's rounds: how many, and their median.
type group struct {
	n      int
	median float64
}

// twoGroups splits v in the two groups its values fall into: the split
// of the sorted values that leaves the least squared deviation from each
// group's mean (the best two-cluster split in one dimension). lo holds
// the smaller values; with fewer than two values hi is empty.
func twoGroups(v []float64) (lo, hi group) {
	s := slices.Sorted(slices.Values(v))
	if len(s) < 2 {
		return group{n: len(s), median: median(s)}, group{}
	}
	ss := func(a []float64) float64 {
		m := 0.0
		for _, x := range a {
			m += x
		}
		m /= float64(len(a))
		d := 0.0
		for _, x := range a {
			d += (x - m) * (x - m)
		}
		return d
	}
	best, at := math.Inf(1), 1
	for k := 1; k < len(s); k++ {
		if d := ss(s[:k]) + ss(s[k:]); d < best {
			best, at = d, k
		}
	}
	return group{n: at, median: median(s[:at])}, group{n: len(s) - at, median: median(s[at:])}
}

// groupsCell is the two groups of v's rounds, the fast one first: "fast
// 10.7 (7/10), slow 16.9 (3/10)", with f formatting a value; higher says
// whether a higher value is the faster (a throughput).
func groupsCell(v []float64, f func(float64) string, higher bool) string {
	lo, hi := twoGroups(v)
	fast, slow := lo, hi
	if higher {
		fast, slow = hi, lo
	}
	n := len(v)
	if fast.n == 0 || slow.n == 0 {
		return fmt.Sprintf("%s (%d/%d)", f(lo.median), lo.n, n)
	}
	return fmt.Sprintf("fast %s (%d/%d), slow %s (%d/%d)", f(fast.median), fast.n, n, f(slow.median), slow.n, n)
}

// microseconds is per-round durations in µs.
func microseconds(r []time.Duration) []float64 {
	out := make([]float64, len(r))
	for i, d := range r {
		out[i] = float64(d) / 1e3
	}
	return out
}

func oneDecimal(v float64) string { return fmt.Sprintf("%.1f", v) }
func noDecimal(v float64) string  { return fmt.Sprintf("%.0f", v) }

// The columns of the benchmarks' tables of targets (newTargets), by name:
// test/bench/benchreport reads the tables by them.
const (
	ColTarget  = "target"
	ColConfig  = "configuration"
	ColJudged  = "one CPU, paired per round: median [min–max]"
	ColWithin  = "rounds within the target"
	ColMet     = "target met"
	ColGroups  = "one CPU, the rounds in two groups"
	ColMedians = "one CPU, from the rounds' medians"
	ColSpread  = "spread (not judged), paired per round: median [min–max]"
)
