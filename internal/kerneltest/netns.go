package kerneltest

import (
	"fmt"
	"os"
	"testing"

	"github.com/meshwire/meshwire/internal/netns"
)

// NewNS creates a throwaway network namespace named mwt-TAG-PID (under
// netns.RunDir, so `ip netns exec NAME` reaches it) and removes it when t
// ends (for a benchmark, after each of its runs). Call Require first.
func NewNS(t testing.TB, tag string) (name, path string) {
	t.Helper()
	name, path = create(t, tag)
	t.Cleanup(func() { _ = netns.Delete(name) })
	return name, path
}

// InNewNS runs fn inside a throwaway namespace named as NewNS names it,
// removed when InNewNS returns (so one test may call it again with the
// same tag), and fails t when fn fails.
func InNewNS(t testing.TB, tag string, fn func(name, path string) error) {
	t.Helper()
	name, path := create(t, tag)
	defer func() { _ = netns.Delete(name) }()
	if err := netns.Enter(path, func() error { return fn(name, path) }); err != nil {
		t.Fatal(err)
	}
}

func create(t testing.TB, tag string) (name, path string) {
	t.Helper()
	name = fmt.Sprintf("mwt-%s-%d", tag, os.Getpid())
	path, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	return name, path
}
