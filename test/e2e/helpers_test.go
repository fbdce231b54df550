//go:build kernel

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/meshwire/meshwire/internal/installer"
	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
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

// loopbackIntercept is the conflist NAME of loopback and the intercept
// entry exactly as `meshwire install --chain` writes it (the pod's links
// are the test's own: portmap and bandwidth, which --chain adds too, need
// an interface plugin's veth).
func loopbackIntercept(t *testing.T, h *harness.H, name string) *libcni.NetworkConfigList {
	t.Helper()
	chained, err := installer.Chain([]byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"loopback"}]}`, name)))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(chained.Out, &conf); err != nil || len(conf.Plugins) != 4 || !strings.Contains(string(conf.Plugins[3]), `"type":"intercept"`) {
		t.Fatalf("chained config (%v):\n%s", err, chained.Out)
	}
	return h.ConfList(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[%s,%s]}`, name, conf.Plugins[0], conf.Plugins[3]))
}
