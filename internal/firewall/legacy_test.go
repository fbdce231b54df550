package firewall

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/filelock"
	"github.com/meshwire/meshwire/internal/netns"
)

// kernelNS runs fn in a throwaway network namespace, holding the node-wide
// test lock the end-to-end tests hold.
func kernelNS(t *testing.T, fn func(name string) error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("kernel test: run as root")
	}
	l, err := filelock.Acquire("/run/meshwire-tests.lock", 60*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	name := fmt.Sprintf("mwt-fwlegacy-%d", os.Getpid())
	p, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = netns.Delete(name) }()
	if err := netns.Enter(p, func() error { return fn(name) }); err != nil {
		t.Fatal(err)
	}
}

// TestLegacyChains: the getsockopt read sees the user chains iptables-legacy
// made, of both families, and a namespace whose legacy nat table was never
// used reads as empty without loading it.
func TestLegacyChains(t *testing.T) {
	kernelNS(t, func(name string) error {
		for _, f := range []Family{V4, V6} {
			got, err := legacyChains(f, "nat")
			if err != nil || got != nil {
				return fmt.Errorf("IPv%d before any use: %v, %v", f, got, err)
			}
		}
		ipt := func(tool string, args ...string) error {
			out, err := exec.Command("ip", append([]string{"netns", "exec", name, tool, "-w", "5", "-t", "nat"}, args...)...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s %v: %v: %s", tool, args, err, out)
			}
			return nil
		}
		for _, c := range [][]string{
			{"iptables-legacy", "-N", "CNI-f0bca4ac77cde1bf2f3da5df"},
			{"iptables-legacy", "-A", "CNI-f0bca4ac77cde1bf2f3da5df", "-d", "198.18.0.0/24", "-m", "comment", "--comment", "name: \"x\" id: \"y\"", "-j", "ACCEPT"},
			{"iptables-legacy", "-A", "POSTROUTING", "-s", "198.18.0.5", "-j", "CNI-f0bca4ac77cde1bf2f3da5df"},
			{"iptables-legacy", "-N", "CNI-HOSTPORT-DNAT"},
			{"ip6tables-legacy", "-N", "CNI-DN-f0bca4ac77cde1bf2f3da"},
		} {
			if err := ipt(c[0], c[1:]...); err != nil {
				return err
			}
		}
		v4, err := legacyChains(V4, "nat")
		if err != nil {
			return err
		}
		if len(v4) != 2 || !v4["CNI-f0bca4ac77cde1bf2f3da5df"] || !v4["CNI-HOSTPORT-DNAT"] {
			return fmt.Errorf("IPv4 chains %v", v4)
		}
		v6, err := legacyChains(V6, "nat")
		if err != nil {
			return err
		}
		if len(v6) != 1 || !v6["CNI-DN-f0bca4ac77cde1bf2f3da"] {
			return fmt.Errorf("IPv6 chains %v", v6)
		}
		return nil
	})
}
