package undo

import (
	"strings"
	"testing"
)

func TestStack(t *testing.T) {
	var s Stack
	var got []string
	s.Push(func() { got = append(got, "a") })
	s.Push(func() { got = append(got, "b") })
	s.Run()
	s.Run()
	if strings.Join(got, "") != "ba" {
		t.Fatalf("undo order %v, want b then a, once", got)
	}
}
