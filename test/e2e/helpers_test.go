//go:build kernel

package e2e

import (
	"errors"
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
	const nat = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"
	for _, tool := range []string{"iptables-restore", "ip6tables-restore", "iptables-legacy-restore", "ip6tables-legacy-restore", "iptables-nft-restore", "ip6tables-nft-restore"} {
		cmd := exec.Command(tool, "--noflush", "-w", "10")
		cmd.Stdin = strings.NewReader(nat)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", tool, err, out)
		}
	}
}
