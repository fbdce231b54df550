//go:build kernel

package harness

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// recorder stands in for testing.T to observe what the harness reports.
type recorder struct {
	testing.TB
	errs     []string
	cleanups []func()
}

func (r *recorder) Helper()                   {}
func (r *recorder) Errorf(f string, a ...any) { r.errs = append(r.errs, fmt.Sprintf(f, a...)) }
func (r *recorder) Cleanup(f func())          { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Fatalf(f string, a ...any) { r.TB.Fatalf(f, a...) }
func (r *recorder) runCleanups() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// TestCheckNoLeaksCatchesALeak proves the leak check can fail: a veth pair
// left on the host and a named namespace left behind are both reported.
func TestCheckNoLeaksCatchesALeak(t *testing.T) {
	h := New(t)
	rec := &recorder{TB: t}
	fake := *h
	fake.T = rec
	fake.CheckNoLeaks()

	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "mwt-leak0"}, PeerName: "mwt-leak1"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	ns := fake.NewNS("leak") // registers its removal on the recorder, not on t
	rec.runCleanups()        // removes the namespace, then compares
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "mwt-leak0") {
		t.Fatalf("leak check reported %q, want the veth", rec.errs)
	}
	if strings.Contains(rec.errs[0], ns.Name) {
		t.Fatalf("the namespace was removed by its cleanup but reported: %q", rec.errs)
	}

	// Nothing changed: nothing reported.
	rec2 := &recorder{TB: t}
	fake.T = rec2
	fake.CheckNoLeaks()
	rec2.runCleanups()
	if len(rec2.errs) != 0 {
		t.Fatalf("no change, yet reported %q", rec2.errs)
	}
}

func TestNSHelpers(t *testing.T) {
	h := New(t)
	ns := h.NewNS("helpers")
	if ns.IsUp("lo") {
		t.Fatal("lo up in a fresh namespace")
	}
	if out, err := ns.Exec("ip", "link", "set", "lo", "up"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !ns.IsUp("lo") || !slices.Contains(ns.Addrs("lo"), "127.0.0.1/8") {
		t.Fatalf("lo after up: %v", ns.Addrs("lo"))
	}
	if ns.HasLink("eth0") {
		t.Fatal("eth0 in a fresh namespace")
	}
	for _, want := range []string{"0", "1"} {
		if out, err := ns.Exec("sh", "-c", "echo "+want+" > /proc/sys/net/ipv4/ip_forward"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if v := ns.Sysctl("net.ipv4.ip_forward"); v != want {
			t.Fatalf("ip_forward = %q, want %q", v, want)
		}
	}
	if len(ns.Routes(netlink.FAMILY_V4)) != 0 {
		t.Fatal("main table routes in a fresh namespace")
	}
	if len(ns.Qdiscs("lo")) == 0 {
		t.Fatal("no qdisc on lo")
	}
	if _, err := ns.Exec("iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9", "-j", "RETURN"); err != nil {
		t.Fatal(err)
	}
	if got := ns.IPTablesSave("iptables-save", "nat"); !strings.Contains(got, "-A OUTPUT -p tcp -m tcp --dport 9 -j RETURN") || strings.Contains(got, "[0:0]") {
		t.Fatalf("IPTablesSave: %q", got)
	}
}

func TestSamples(t *testing.T) {
	var s Samples
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	if s.Median() != 50*time.Millisecond || s.P95() != 95*time.Millisecond || s.Quantile(0) != time.Millisecond || s.Quantile(1) != 100*time.Millisecond {
		t.Fatalf("median %s p95 %s", s.Median(), s.P95())
	}
	if Ratio(time.Second, 2*time.Second) != "0.50x" || Ms(1500*time.Microsecond) != "1.50" {
		t.Fatal("formatting")
	}
	var empty Samples
	if empty.Median() != 0 {
		t.Fatal("empty median")
	}
}
