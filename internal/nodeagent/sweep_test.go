package nodeagent

import (
	"errors"
	"maps"
	"testing"
)

// TestSweepTwice: an entry goes only when two sweeps in a row report it
// with the same inode; one reported once, or with another inode the
// second time, stays; a failed forget stops the sweep with its error.
func TestSweepTwice(t *testing.T) {
	var s nsSweep[uint64]
	var forgot []uint64
	forget := func(ns, ino uint64) error { forgot = append(forgot, ns); return nil }
	log := func(ns, ino uint64) {}
	if err := s.sweep(map[uint64]uint64{1: 10, 2: 20}, forget, log); err != nil || len(forgot) != 0 {
		t.Fatalf("first sweep forgot %v (%v)", forgot, err)
	}
	if err := s.sweep(map[uint64]uint64{1: 10, 2: 21, 3: 30}, forget, log); err != nil {
		t.Fatal(err)
	}
	if len(forgot) != 1 || forgot[0] != 1 || s.collected != 1 {
		t.Fatalf("second sweep forgot %v (collected %d), want [1]", forgot, s.collected)
	}
	if want := map[uint64]uint64{2: 21, 3: 30}; !maps.Equal(s.suspects, want) {
		t.Fatalf("suspects %v, want %v", s.suspects, want)
	}
	boom := errors.New("boom")
	if err := s.sweep(map[uint64]uint64{3: 30}, func(ns, ino uint64) error { return boom }, log); !errors.Is(err, boom) {
		t.Fatalf("a failed forget: %v", err)
	}
}
