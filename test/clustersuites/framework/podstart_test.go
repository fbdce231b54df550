package framework

import (
	"strings"
	"testing"
)

// TestComparePodStart: a ratio above its target fails the comparison, one
// below passes; an empty run fails.
func TestComparePodStart(t *testing.T) {
	a := PodStartResult{Pods: 4, Rounds: 1, StartMS: []float64{100, 110, 120, 400}, DeleteS: []float64{2}}
	b := PodStartResult{Pods: 4, Rounds: 1, StartMS: []float64{100, 100, 110, 200}, DeleteS: []float64{2}}
	if _, err := ComparePodStart("m", a, "r", b, []PodStartTarget{{50, 1.10}}); err != nil {
		t.Errorf("p50 1.10x within 1.10x: %v", err)
	}
	table, err := ComparePodStart("m", a, "r", b, []PodStartTarget{{50, 1.10}, {99, 1.20}})
	if err == nil || !strings.Contains(err.Error(), "p99 2.00x") || !strings.Contains(table, "**missed**") {
		t.Errorf("p99 2x against 1.20x: %v\n%s", err, table)
	}
	if _, err := ComparePodStart("m", PodStartResult{}, "r", b, []PodStartTarget{{50, 1.10}}); err == nil {
		t.Error("an empty run passed")
	}
	if p := Percentile([]float64{5, 1, 3, 2, 4}, 50); p != 3 {
		t.Errorf("p50 of 1..5: %g", p)
	}
}
