//go:build kernel

package capture

import (
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/origdst"
)

// attachForTest attaches the programs at a pin directory of the test's own
// and detaches them when t ends.
func attachForTest(t *testing.T) string {
	t.Helper()
	dir := filepath.Join("/sys/fs/bpf", "mwt-capture")
	_, _ = Detach(dir, true)
	if _, err := Attach("", dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := Detach(dir, true); err != nil {
			t.Error(err)
		}
	})
	return dir
}

// TestOutboundRedirect: in a registered namespace, a connection to a
// captured destination reaches the outbound listener on loopback, which
// reads the original destination with SO_ORIGINAL_DST; an excluded port
// and a namespace that is not registered are left alone.
func TestOutboundRedirect(t *testing.T) {
	kerneltest.Require(t)
	dir := attachForTest(t)
	_, path := kerneltest.NewNS(t, "capture")
	if out, err := exec.Command("ip", "netns", "exec", filepath.Base(path), "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v\n%s", err, out)
	}
	cfg := intercept.Default()
	cfg.InboundPorts = intercept.Ports{}
	cfg.OutboundPortsExclude = []uint16{9999}
	s, err := pods.SettingsOf(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ln *net.TCPListener
	err = netns.Enter(path, func() error {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{Port: int(cfg.ProxyPort)})
		ln = l
		if err != nil {
			return err
		}
		return pods.Register(dir, s)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.AcceptTCP()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		d, err := origdst.Redirected(c)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- d.String()
		_, _ = io.Copy(io.Discard, c)
	}()
	dst := netip.MustParseAddrPort("203.0.113.9:80")
	err = netns.Enter(path, func() error {
		c, err := net.DialTimeout("tcp", dst.String(), 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	if g := <-got; g != dst.String() {
		t.Fatalf("the proxy read original destination %q, want %s", g, dst)
	}
}
