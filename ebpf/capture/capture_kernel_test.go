//go:build kernel

package capture

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/apply"
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
	s, err := apply.SettingsOf(cfg, nil, true)
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

// TestStale: a pod whose namespace is deleted without a DEL is reported by
// pods.Stale and forgotten by ForgetStale; a live pod is never reported;
// ForgetStale leaves alone a registration whose inode is not the one
// reported.
func TestStale(t *testing.T) {
	kerneltest.Require(t)
	dir := attachForTest(t)
	s, err := apply.SettingsOf(intercept.Default(), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	type pod struct {
		name       string
		cookie, in uint64
	}
	var ps []pod
	for _, tag := range []string{"stale-a", "stale-b"} {
		name, path := kerneltest.NewNS(t, tag)
		p := pod{name: name}
		err := netns.Enter(path, func() (err error) {
			if p.cookie, err = netns.Cookie(); err != nil {
				return err
			}
			if p.in, err = netns.Inode(); err != nil {
				return err
			}
			return pods.Register(dir, s)
		})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	stale, err := pods.Stale(dir, netns.Live)
	if err != nil || len(stale) != 0 {
		t.Fatalf("with both namespaces there, Stale = %v, %v; want none", stale, err)
	}
	if err := netns.Delete(ps[0].name); err != nil {
		t.Fatal(err)
	}
	stale, err = pods.Stale(dir, netns.Live)
	if err != nil || len(stale) != 1 || stale[ps[0].cookie] != ps[0].in {
		t.Fatalf("with %s deleted, Stale = %v, %v; want {%d: %d}", ps[0].name, stale, err, ps[0].cookie, ps[0].in)
	}
	if err := pods.ForgetStale(dir, ps[0].cookie, ps[0].in+1); err != nil {
		t.Fatal(err)
	}
	if st, _ := ReadStatus(dir); st.Pods != 2 {
		t.Fatalf("ForgetStale with another inode removed a registration: %d pods left", st.Pods)
	}
	if err := pods.ForgetStale(dir, ps[0].cookie, ps[0].in); err != nil {
		t.Fatal(err)
	}
	if st, _ := ReadStatus(dir); st.Pods != 1 {
		t.Fatalf("after ForgetStale, %d pods registered, want 1", st.Pods)
	}
	if stale, err := pods.Stale(dir, netns.Live); err != nil || len(stale) != 0 {
		t.Fatalf("after ForgetStale, Stale = %v, %v; want none", stale, err)
	}
}

// TestDNSHooksUpgrade: over programs of a build without the DNS hooks
// (their links unpinned, which detaches them), a pod with DNS capture is
// refused, naming the fix; attach from this build adds the hooks in
// place, and the pod registers.
func TestDNSHooksUpgrade(t *testing.T) {
	kerneltest.Require(t)
	dir := attachForTest(t)
	dnsHooks := []string{"getpeername4_link", "getpeername6_link", "recvmsg6_link", loader.PinDNSHook, "sendmsg6_link", "sendmsg4_link"}
	for _, pin := range dnsHooks {
		if err := os.Remove(filepath.Join(dir, pin)); err != nil {
			t.Fatal(err)
		}
	}
	_, path := kerneltest.NewNS(t, "capture-dns")
	cfg := intercept.Default()
	cfg.RedirectDNS, cfg.CaptureAllDNS = true, true
	s, err := apply.SettingsOf(cfg, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	register := func() error { return netns.Enter(path, func() error { return pods.Register(dir, s) }) }
	if err := register(); !errors.Is(err, pods.ErrNoDNSHooks) {
		t.Fatalf("a DNS pod over programs without the DNS hooks: %v, want ErrNoDNSHooks", err)
	}
	if st, err := ReadStatus(dir); err != nil || st.Pods != 0 {
		t.Fatalf("after the refusal: %+v, %v; want no pod registered", st, err)
	}
	res, err := Attach("", dir)
	if err != nil || res != loader.Replaced {
		t.Fatalf("attach over the older build: %v, %v; want Replaced", res, err)
	}
	for _, pin := range dnsHooks {
		if _, err := os.Stat(filepath.Join(dir, pin)); err != nil {
			t.Fatalf("after the upgrade: %v", err)
		}
	}
	if err := register(); err != nil {
		t.Fatalf("a DNS pod after the upgrade: %v", err)
	}
}
