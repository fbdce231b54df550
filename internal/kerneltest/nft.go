package kerneltest

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/netns"
)

// SameAsNft checks a table meshwire writes over netlink against nft's own
// encoding of the same table: in one throwaway namespace `nft -f` applies
// script, in another write runs (inside it, with no tool on PATH), and
// `nft --debug=netlink list table FAMILY TABLE` must print the same in
// both, statement for statement and expression for expression. It returns
// the path of the namespace write ran in, for what the test does next.
func SameAsNft(t *testing.T, tag, family, table, script string, write func() error) string {
	t.Helper()
	list := func(name string) string {
		t.Helper()
		out, err := exec.Command("ip", "netns", "exec", name, "nft", "--debug=netlink", "list", "table", family, table).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list: %v: %s", err, out)
		}
		return string(out)
	}
	byTool, _ := NewNS(t, tag+"t")
	byNetlink, path := NewNS(t, tag+"n")
	cmd := exec.Command("ip", "netns", "exec", byTool, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s\n%s", err, out, script)
	}
	err := WithoutTools(t, func() error { return netns.Enter(path, write) })
	if err != nil {
		t.Fatal(err)
	}
	if want, got := list(byTool), list(byNetlink); want != got {
		t.Fatalf("over netlink:\n%s\nnft -f of the script:\n%s", got, want)
	}
	return path
}

// WithoutTools runs fn with a PATH that holds no program, as on a node
// with no firewall tool installed (plugins run through libcni inherit it).
func WithoutTools(t testing.TB, fn func() error) error {
	t.Helper()
	path := os.Getenv("PATH")
	defer os.Setenv("PATH", path)
	os.Setenv("PATH", t.TempDir())
	return fn()
}
