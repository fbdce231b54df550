package kerneltest

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/meshwire/meshwire/internal/netns"
)

// NewNS creates a throwaway network namespace named mwt-TAG-PID-N (under
// netns.RunDir, so `ip netns exec NAME` reaches it; N counts this
// process's namespaces) and removes it when t ends (for a benchmark,
// after each of its runs). It is the one factory of the kernel tests'
// namespaces (test/harness's are made by it too); call Require first. A
// name that starts with "mwt-" is a test's, which the harness removes
// when a killed run left it.
func NewNS(t testing.TB, tag string) (name, path string) {
	t.Helper()
	name, path = create(t, tag)
	t.Cleanup(func() {
		if err := netns.Delete(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	return name, path
}

// made counts the namespaces this process made.
var made atomic.Uint64

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
	name = fmt.Sprintf("mwt-%s-%d-%d", tag, os.Getpid(), made.Add(1))
	path, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	return name, path
}
