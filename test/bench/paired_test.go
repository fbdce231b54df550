package bench

import (
	"math"
	"testing"
)

func TestPairedRatios(t *testing.T) {
	got := pairedRatios([]float64{10, 12, 30}, []float64{20, 0, 40, 50})
	if len(got) != 2 || got[0] != 0.5 || got[1] != 0.75 {
		t.Errorf("pairedRatios = %v, want [0.5 0.75]", got)
	}
}

func TestPairedGaps(t *testing.T) {
	got := pairedGaps([]float64{60, 20, 110}, []float64{100, 20, 100}, []float64{20, 20, 20})
	if len(got) != 2 || math.Abs(got[0]-0.5) > 1e-9 || math.Abs(got[1]+0.125) > 1e-9 {
		t.Errorf("pairedGaps = %v, want [0.5 -0.125]", got)
	}
}

// TestPairedJudgeSlowRounds: the rounds fall in a fast and a slow group,
// which slow the configuration and its baseline alike; one round whose
// configuration ran slow beside a fast baseline moves the ratio of the two
// medians across the target, not the median of the paired ratios.
func TestPairedJudgeSlowRounds(t *testing.T) {
	redir := []float64{19.6, 19.6, 19.6, 19.6, 19.6, 30, 30, 30, 30, 30}
	fast := []float64{10.7, 10.7, 10.7, 10.7, 16, 16, 16, 16, 16, 16}
	if r := floatMedian(fast) / floatMedian(redir); r <= 0.55 {
		t.Fatalf("the example's ratio of medians is %.2f: it should miss 0.55", r)
	}
	j := pairedRatios(fast, redir).judge(atMost(0.55))
	if want := (16.0/30 + 10.7/19.6) / 2; !j.ok || math.Abs(j.median-want) > 1e-9 || j.within != 9 || j.cell(atMost(0.55)) != "0.54x [0.53x–0.82x]" || j.rounds() != "9/10" {
		t.Errorf("judge = %+v, cell %q", j, j.cell(atMost(0.55)))
	}
	if j := pairedRatios([]float64{12, 12, 12}, []float64{20, 20, 20}).judge(atMost(0.55)); j.ok || j.within != 0 {
		t.Errorf("0.6x judged met under 0.55x: %+v", j)
	}
	// Of an even count, the mean of the middle two: the lower one would
	// call 0.5x and 1.01x "met" under 0.55x.
	if j := (perRound{0.5, 1.01}).judge(atMost(0.55)); j.ok || math.Abs(j.median-0.755) > 1e-9 {
		t.Errorf("two rounds, 0.5x and 1.01x: %+v", j)
	}
	if j := perRound(nil).judge(atMost(1)); j.ok || j.cell(atMost(1)) != "n/a" {
		t.Errorf("no rounds judged: %+v", j)
	}
	if j := (perRound{0.3, 0.4, 0.2}).judge(shareAtLeast(0.3)); !j.ok || j.cell(shareAtLeast(0.3)) != "30% [20%–40%]" || j.rounds() != "2/3" {
		t.Errorf("share judge = %+v, %q", j, j.cell(shareAtLeast(0.3)))
	}
	if j := (perRound{1.6, 1.4, 1.5}).judge(atLeast(1.5)); !j.ok || j.within != 2 {
		t.Errorf("at least judge = %+v", j)
	}
}

func TestTwoGroups(t *testing.T) {
	lo, hi := twoGroups([]float64{10.7, 16.9, 10.8, 10.6, 17.5, 10.7, 16.1})
	if lo.n != 4 || lo.median != 10.7 || hi.n != 3 || hi.median != 16.9 {
		t.Errorf("twoGroups = %+v, %+v", lo, hi)
	}
	if got := groupsCell([]float64{10.7, 16.9, 10.8, 10.6, 17.5, 10.7, 16.1}, oneDecimal, false); got != "fast 10.7 (4/7), slow 16.9 (3/7)" {
		t.Errorf("groupsCell = %q", got)
	}
	if got := groupsCell([]float64{3000, 2100, 2900}, noDecimal, true); got != "fast 2950 (2/3), slow 2100 (1/3)" {
		t.Errorf("groupsCell, throughput = %q", got)
	}
	if got := groupsCell([]float64{5}, oneDecimal, false); got != "5.0 (1/1)" {
		t.Errorf("groupsCell, one round = %q", got)
	}
}
