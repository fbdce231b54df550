package netns

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// TestOpenRefuses: what is not a namespace is code 4 naming CNI_NETNS, and
// IsGone (DEL then has nothing to do inside).
func TestOpenRefuses(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"", file, filepath.Join(t.TempDir(), "missing")} {
		ns, err := Open(path)
		if err == nil {
			ns.Close()
			t.Fatalf("Open(%q) succeeded", path)
		}
		if cnierr.Code(err) != cnierr.CodeInvalidEnv {
			t.Errorf("Open(%q): code %d, want %d: %v", path, cnierr.Code(err), cnierr.CodeInvalidEnv, err)
		}
		if path != "" && !IsGone(err) {
			t.Errorf("Open(%q): not IsGone: %v", path, err)
		}
	}
}

// TestOpenStillThere needs root: it opens a real namespace, reads its
// loopback through the handle, and sees the namespace go.
func TestOpenStillThere(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (network namespaces)")
	}
	old := RunDir
	RunDir = t.TempDir()
	defer func() { RunDir = old }()
	p, err := Create("mwt-open")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Delete("mwt-open") })
	ns, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	lo, err := ns.NL.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.NL.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	addrs, err := ns.NL.AddrList(lo, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IP.String() != "127.0.0.1" {
		t.Fatalf("addresses of lo in the namespace: %v, %v", addrs, err)
	}
	if err := ns.StillThere(p); err != nil {
		t.Fatalf("StillThere on a live namespace: %v", err)
	}
	if err := Delete("mwt-open"); err != nil {
		t.Fatal(err)
	}
	if err := ns.StillThere(p); cnierr.Code(err) != cnierr.CodeInvalidEnv {
		t.Fatalf("StillThere after delete: %v", err)
	}
}
