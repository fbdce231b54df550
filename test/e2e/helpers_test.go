//go:build kernel

package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/probe"

	"github.com/containernetworking/cni/pkg/types"
)

func asCNIError(err error, target **types.Error) bool { return errors.As(err, target) }

func probePing(nsPath, ip string) (time.Duration, error) {
	return probe.Ping(nsPath, net.ParseIP(ip), 2*time.Second)
}

// nodeBaseline puts in place, before a test's leak snapshot, the node-level
// state that any node running pods has and that nobody removes: IP
// forwarding (enabling IPv6 forwarding adds anycast routes) and the nat
// table of every iptables variant with the built-in chains masquerade and
// host ports hook into (iptables creates a table and its built-in chains on
// first use, and never deletes them).
func nodeBaseline(t *testing.T) {
	t.Helper()
	for _, key := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(key, []byte("1"), 0o644); err != nil {
			t.Fatalf("enable forwarding: %v", err)
		}
	}
	for _, tool := range []string{"iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy", "iptables-nft", "ip6tables-nft"} {
		if err := natRestore(tool, ":PREROUTING ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]", ":POSTROUTING ACCEPT [0:0]"); err != nil {
			t.Fatalf("%s-restore: %v", tool, err)
		}
	}
}

// natRestore applies lines to the nat table with tool ("iptables",
// "ip6tables-legacy", ...) in one --noflush transaction, leaving the rest
// in place.
func natRestore(tool string, lines ...string) error {
	cmd := exec.Command(tool+"-restore", "--noflush", "-w", "10")
	cmd.Stdin = strings.NewReader("*nat\n" + strings.Join(lines, "\n") + "\nCOMMIT\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}
