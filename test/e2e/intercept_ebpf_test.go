//go:build kernel

package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// TestInterceptEBPF runs the traffic of TestInterceptTraffic in EBPF mode
// (iptables-init -m EBPF with the programs attached by `meshwire fastpath
// attach`), with the test proxy reading SO_ORIGINAL_DST as with REDIRECT,
// and checks that the pod's namespace has no netfilter rule and no
// conntrack entry through all of it.
func TestInterceptEBPF(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	if code, out, err := ie.Fastpath(h, "attach"); err != nil || code != 0 {
		t.Fatalf("meshwire fastpath attach: exit %d, %v\n%s", code, err, out)
	}
	t.Cleanup(func() {
		if code, out, err := ie.Fastpath(h, "detach", "--force"); err != nil || code != 0 {
			t.Errorf("meshwire fastpath detach: exit %d, %v\n%s", code, err, out)
		}
	})
	e := ie.New(t, h)
	e.StartProxy(false)
	run := func(args ...string) {
		t.Helper()
		e.MustIptablesInit(append([]string{"-m", "EBPF", "--reconcile"}, args...)...)
	}

	t.Run("everything", func(t *testing.T) {
		run("-i", "*", "-b", "*")
		for _, fam := range interceptFamilies {
			pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
			interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "outbound")
			mark := e.Proxy.Mark()
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", interceptPassthrough(fam.v6), "inbound")
			// The proxy sees the client's own address, as with TPROXY.
			if src, err := netip.ParseAddrPort(e.Proxy.Since(mark)[0].Src); err != nil || src.Addr() != remote {
				t.Fatalf("%s: the proxy saw inbound client %s, want %s", fam.name, e.Proxy.Since(mark)[0].Src, remote)
			}
			// The tunnel port is not captured, as with REDIRECT.
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.TunnelPort), "app", remote.String(), "")
			lo := netip.MustParseAddr("127.0.0.1")
			if fam.v6 {
				lo = netip.IPv6Loopback()
			}
			interceptExpect(t, e, e.Pod, ie.AP(lo, ie.AppPort), "app", lo.String(), "")
			interceptExpect(t, e, e.Pod, ie.AP(pod, ie.AppPort), "app", pod.String(), "")
			// A namespace that is not registered is left alone.
			interceptExpect(t, e, e.Remote, ie.AP(remote, ie.RemotePort), "remote", remote.String(), "")
		}
	})

	t.Run("proxy-owner-bypass", func(t *testing.T) {
		run("-i", "*", "-b", "*", "-u", "1337", "-g", "1337")
		for _, fam := range interceptFamilies {
			pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
			dst := ie.AP(remote, ie.RemotePort)
			for _, who := range []struct {
				uid, gid uint32
				listener string
			}{{ie.ProxyUID, ie.ProxyUID, ""}, {ie.OtherUID, ie.ProxyUID, ""}, {ie.ProxyUID, ie.OtherUID, ""}, {ie.OtherUID, ie.OtherUID, "outbound"}} {
				mark := e.Proxy.Mark()
				reply, err := e.DialAs(who.uid, who.gid, dst, "owner")
				if err != nil {
					t.Fatalf("%s: request as %d:%d: %v", fam.name, who.uid, who.gid, err)
				}
				if want := "remote " + pod.String() + " owner"; reply != want {
					t.Fatalf("%s: request as %d:%d: reply %q, want %q", fam.name, who.uid, who.gid, reply, want)
				}
				interceptCheckRecords(t, e, mark, dst, who.listener)
			}
			// The proxy calling its own pod's address goes through the
			// inbound side, but for the tunnel port.
			mark := e.Proxy.Mark()
			reply, err := e.DialAs(ie.ProxyUID, ie.ProxyUID, ie.AP(pod, ie.AppPort), "self")
			if err != nil || reply != "app "+interceptPassthrough(fam.v6)+" self" {
				t.Fatalf("%s: proxy to its own pod: %q, %v", fam.name, reply, err)
			}
			interceptCheckRecords(t, e, mark, ie.AP(pod, ie.AppPort), "inbound")
			mark = e.Proxy.Mark()
			if reply, err := e.DialAs(ie.ProxyUID, ie.ProxyUID, ie.AP(pod, ie.TunnelPort), "tunnel"); err != nil || reply != "app "+pod.String()+" tunnel" {
				t.Fatalf("%s: proxy to its own pod's tunnel port: %q, %v", fam.name, reply, err)
			}
			interceptCheckRecords(t, e, mark, ie.AP(pod, ie.TunnelPort), "")
		}
	})

	t.Run("exclusions", func(t *testing.T) {
		run("-i", "*", "-b", "*", "-d", fmt.Sprint(ie.AppPort2), "-o", fmt.Sprint(ie.RemotePort2),
			"-x", ie.ExtraV4.String()+"/32,"+ie.ExtraV6.String()+"/128")
		for _, fam := range interceptFamilies {
			pod, remote, extra := ie.Pod(fam.v6), ie.Remote(fam.v6), ie.Extra(fam.v6)
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort2), "app", remote.String(), "")
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", interceptPassthrough(fam.v6), "inbound")
			interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort2), "remote", pod.String(), "")
			interceptExpect(t, e, e.Pod, ie.AP(extra, ie.RemotePort), "remote", pod.String(), "")
			interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "outbound")
		}
	})

	t.Run("lists", func(t *testing.T) {
		run("-b", fmt.Sprint(ie.AppPort2), "-i", "198.18.64.0/24,fd70:64::/64")
		for _, fam := range interceptFamilies {
			pod, remote, extra := ie.Pod(fam.v6), ie.Remote(fam.v6), ie.Extra(fam.v6)
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", remote.String(), "")
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort2), "app", interceptPassthrough(fam.v6), "inbound")
			interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "outbound")
			interceptExpect(t, e, e.Pod, ie.AP(extra, ie.RemotePort), "remote", pod.String(), "")
		}
		run("-b", "", "-i", "", "-q", fmt.Sprint(ie.RemotePort))
		for _, fam := range interceptFamilies {
			pod, remote, extra := ie.Pod(fam.v6), ie.Remote(fam.v6), ie.Extra(fam.v6)
			interceptExpect(t, e, e.Pod, ie.AP(extra, ie.RemotePort), "remote", pod.String(), "outbound")
			interceptExpect(t, e, e.Pod, ie.AP(extra, ie.RemotePort2), "remote", pod.String(), "")
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", remote.String(), "")
		}
	})

	t.Run("host-untouched", func(t *testing.T) {
		// A host process connecting to the proxy's outbound port number
		// reaches its own listener: the host namespace is never a pod's.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		a, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
		if c.RemoteAddr().String() != ln.Addr().String() {
			t.Fatalf("a host connection to %s went to %s", ln.Addr(), c.RemoteAddr())
		}
	})

	t.Run("no-netfilter", func(t *testing.T) {
		out, err := e.Pod.Exec("conntrack", "-L")
		if err != nil {
			t.Fatalf("conntrack -L in the pod: %v\n%s", err, out)
		}
		if !strings.Contains(out, " 0 flow entries have been shown") {
			t.Fatalf("the pod's namespace has conntrack entries after the traffic, want none:\n%s", out)
		}
		for _, tool := range [][]string{{"nft", "list", "ruleset"}, {"cat", "/proc/net/ip_tables_names"}, {"cat", "/proc/net/ip6_tables_names"}} {
			out, err := e.Pod.Exec(tool[0], tool[1:]...)
			if err != nil {
				t.Fatalf("%s: %v\n%s", tool, err, out)
			}
			if strings.TrimSpace(out) != "" {
				t.Fatalf("%s in the pod shows rules or tables:\n%s", strings.Join(tool, " "), out)
			}
		}
	})
}
