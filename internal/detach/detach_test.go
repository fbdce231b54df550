package detach

import (
	"errors"
	"testing"
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
