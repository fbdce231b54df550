package golden

import (
	"os"
	"path/filepath"
	"testing"
)

// recorder is a testing.TB that records failures instead of stopping.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Fatalf(string, ...any) { r.failed = true }
func (r *recorder) Helper()               {}

func TestCheckAndUpdate(t *testing.T) {
	old := Dir
	Dir = filepath.Join(t.TempDir(), "golden")
	defer func() { Dir = old }()

	r := &recorder{TB: t}
	Check(r, "x", "a\n")
	if !r.failed {
		t.Fatal("a missing golden file passed")
	}
	t.Setenv(EnvUpdate, "1")
	Check(t, "x", "a\nb\n")
	if b, err := os.ReadFile(filepath.Join(Dir, "x.golden")); err != nil || string(b) != "a\nb\n" {
		t.Fatalf("update wrote %q, %v", b, err)
	}
	t.Setenv(EnvUpdate, "")
	Check(t, "x", "a\nb\n")
	r = &recorder{TB: t}
	Check(r, "x", "a\nc\n")
	if !r.failed {
		t.Fatal("a different output passed")
	}
}

func TestFirstDifference(t *testing.T) {
	for _, c := range []struct{ got, want, line string }{
		{"a\nb\n", "a\nc\n", "line 2"},
		{"a\n", "a\nb\n", "line 2"},
		{"x", "y", "line 1"},
		{"a\nb", "a\nb\n", "line 2"},
	} {
		if l := firstDifference(c.got, c.want); l != c.line {
			t.Errorf("firstDifference(%q, %q) = %s, want %s", c.got, c.want, l, c.line)
		}
	}
}
