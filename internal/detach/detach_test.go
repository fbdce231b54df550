package detach

import (
	"errors"
	"testing"
	"time"
)

func TestDispatch(t *testing.T) {
	var got string
	jobs := map[string]Job{"a": func(arg string) error { got = arg; return nil }, "b": func(string) error { return errors.New("b failed") }}
	if err := dispatch(jobs, "a:x:y"); err != nil || got != "x:y" {
		t.Fatalf("got %q %v", got, err)
	}
	if dispatch(jobs, "b:") == nil {
		t.Fatal("the job's error is lost")
	}
	for _, bad := range []string{"", "c:1", "a"} {
		if dispatch(jobs, bad) == nil {
			t.Errorf("%q dispatched", bad)
		}
	}
}

func TestHoldJobIsBuiltIn(t *testing.T) {
	if err := dispatch(nil, holdJob+":"); err != nil {
		t.Fatalf("hold job: %v", err)
	}
}

// TestWaitGone: the wait ends when the parent changes, and at the limit
// when it never does.
func TestWaitGone(t *testing.T) {
	calls := 0
	waitGone(10, func() int {
		calls++
		if calls > 3 {
			return 1
		}
		return 10
	}, time.Minute)
	if calls != 4 {
		t.Fatalf("parent polled %d times, want 4", calls)
	}
	start := time.Now()
	waitGone(10, func() int { return 10 }, 20*time.Millisecond)
	if d := time.Since(start); d < 20*time.Millisecond || d > time.Second {
		t.Fatalf("wait with a parent that stays: %v", d)
	}
}
