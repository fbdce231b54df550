package docs

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// conflictMarkers finds the lines of a merge conflict that git leaves in
// a file: "<<<<<<< ", ">>>>>>> " and a bare "=======" between them.
func conflictMarkers(b []byte) []int {
	var lines []int
	s := bufio.NewScanner(bytes.NewReader(b))
	s.Buffer(nil, 1<<20)
	open := false
	for n := 1; s.Scan(); n++ {
		l := s.Text()
		switch {
		case strings.HasPrefix(l, "<<<<<<< "):
			open = true
			lines = append(lines, n)
		case open && l == "=======":
			lines = append(lines, n)
		case strings.HasPrefix(l, ">>>>>>> "):
			open = false
			lines = append(lines, n)
		}
	}
	return lines
}

// TestNoConflictMarkers: no tracked text file holds what a merge left
// unresolved (a Go file would not build, but a page or a script would
// go on carrying both sides).
func TestNoConflictMarkers(t *testing.T) {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil || bytes.IndexByte(b, 0) >= 0 {
			continue // gone from the work tree, or binary
		}
		if at := conflictMarkers(b); len(at) > 0 {
			t.Errorf("%s: merge conflict markers at lines %v", f, at)
		}
	}
}

func TestConflictMarkersFound(t *testing.T) {
	b := []byte("a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> branch\nd\n=======\n")
	if got := conflictMarkers(b); len(got) != 3 || got[0] != 2 || got[1] != 4 || got[2] != 6 {
		t.Fatalf("conflictMarkers = %v, want [2 4 6]", got)
	}
}
