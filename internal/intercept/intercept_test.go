package intercept

import (
	"context"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// stateOf reads the state of iptables-save output, as install reads it
// from legacy iptables.
func stateOf(save string) *State {
	return ReadState(fwtext.ParseIPTablesSave(V4, "", save)...)
}

// saveOf turns a rendered fresh payload into what iptables-save would show
// for it (the built-in chain headers added, comments quoted as iptables-save
// quotes them).
func saveOf(payload string, foreign string) string {
	var b strings.Builder
	for _, line := range strings.Split(payload, "\n") {
		if strings.HasPrefix(line, "*") {
			b.WriteString(line + "\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n")
			if line == "*nat" {
				b.WriteString(foreign)
			}
			continue
		}
		if i := strings.Index(line, "--comment "+Tag); i >= 0 {
			rest := line[i+len("--comment "):]
			tag, tail, _ := strings.Cut(rest, " ")
			line = line[:i] + `--comment "` + tag + `" ` + tail
		}
		if line != "" {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func TestCompareAndRestore(t *testing.T) {
	a := Build(Default(), V4)
	tp := Default()
	tp.Mode = ModeTProxy
	b := Build(tp, V4)
	foreign := ":FOREIGN - [0:0]\n-A OUTPUT -p udp -j FOREIGN\n-A FOREIGN -j RETURN\n"
	installedA := saveOf(fwtext.Text(Restore(a, &State{}), false), foreign)

	st := stateOf(installedA)
	if got := Compare(a, st); got != Current {
		t.Fatalf("A installed, compare with A: %v", got)
	}
	if got := Compare(b, st); got != Different {
		t.Fatalf("A installed, compare with B: %v", got)
	}
	if got := Compare(a, stateOf(strings.Replace(installedA, "-A ISTIO_OUTPUT -j ISTIO_REDIRECT\n", "", 1))); got != Different {
		t.Fatalf("A with a rule missing, compare with A: %v", got)
	}
	if got := Compare(a, stateOf("*nat\n"+foreign+"COMMIT\n")); got != Absent {
		t.Fatalf("nothing installed: %v", got)
	}
	for _, r := range st.Tables[NAT].Builtin {
		if strings.Contains(r.Spec, "FOREIGN") {
			t.Fatalf("foreign rule taken as meshwire's: %s", r.Spec)
		}
	}

	// Reconcile to B: old built-in rules deleted (nat's jump to the
	// inbound chain, which keeps only the tunnel port's rule, as in
	// istio), own chains declared, and the table that gains TPROXY
	// (mangle) committed before nat.
	p := fwtext.Text(Restore(b, st), false)
	if strings.Index(p, "*mangle") > strings.Index(p, "*nat") {
		t.Fatalf("mangle (gaining the inbound capture) must commit before nat (losing it):\n%s", p)
	}
	for _, want := range []string{
		`-D PREROUTING -p tcp -m comment --comment "` + TagFor(a.Fingerprint()) + `" -j ISTIO_INBOUND`,
		"-A PREROUTING -p tcp -m comment --comment " + TagFor(b.Fingerprint()) + " -j ISTIO_INBOUND",
	} {
		if !strings.Contains(p, want) {
			t.Errorf("reconcile payload lacks %q:\n%s", want, p)
		}
	}
	if strings.Contains(p, "FOREIGN") {
		t.Fatalf("reconcile touches foreign rules:\n%s", p)
	}

	// Cleanup: only meshwire's.
	c := fwtext.Text(Restore(&RuleSet{Family: V4}, st), false)
	if strings.Contains(c, "-A ") || strings.Contains(c, "FOREIGN") || !strings.Contains(c, "-X ISTIO_OUTPUT") {
		t.Fatalf("cleanup payload:\n%s", c)
	}
	if !Restore(&RuleSet{Family: V4}, &State{Tables: map[string]*TableState{}}).Empty() {
		t.Fatal("cleanup of nothing is not empty")
	}
}

// An istio-iptables install (untagged jumps) is found and replaced.
func TestReadStateIstio(t *testing.T) {
	save := `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_INBOUND - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -p tcp -j ISTIO_OUTPUT
-A OUTPUT -p udp -j KUBE-SOMETHING
COMMIT
`
	st := stateOf(save)
	if got := st.Tables[NAT].Builtin; len(got) != 2 {
		t.Fatalf("istio's jumps: %v", got)
	}
	if Compare(Build(Default(), V4), st) != Different {
		t.Fatal("istio's rules taken as current")
	}
}

// nftFake is a native nftables firewall holding the rule set as Nft
// writes it.
func nftFake(t *testing.T, rs *RuleSet) *fwfake.Fake {
	t.Helper()
	fw := fwfake.New(firewall.Backend{Kind: firewall.NFTables})
	if err := fw.Apply(context.Background(), Nft(rs)); err != nil {
		t.Fatal(err)
	}
	return fw
}

// nftTables reads istio's inet tables from fw, as install does.
func nftTables(fw *fwfake.Fake) map[string]*installed.Table {
	have := map[string]*installed.Table{}
	for _, nt := range NftTables {
		if tb := fw.Table(ruleset.Inet, nt.Name); tb != nil {
			have[nt.Name] = tb
		}
	}
	return have
}

func TestNftStatus(t *testing.T) {
	a := BuildNft(Default(), true)
	fw := nftFake(t, a)
	have := nftTables(fw)
	if len(have) != 1 {
		t.Fatalf("tables written: %v, want istio-proxy-nat only", have)
	}
	if NftStatus(a, have) != Current || NftStatus(a, nil) != Absent {
		t.Fatal("nft status")
	}
	// A chain emptied behind meshwire's back is noticed.
	var handle uint64
	for _, r := range have["istio-proxy-nat"].Chain("istio-output").Rules {
		if r.Jump == "istio-redirect" {
			handle = r.Handle
		}
	}
	if err := fw.Apply(context.Background(), (&ruleset.Tx{}).DeleteRef(ruleset.TableID{Family: ruleset.Inet, Name: "istio-proxy-nat"}, ruleset.RuleRef{Chain: "istio-output", Handle: handle})); handle == 0 || err != nil {
		t.Fatalf("remove the jump to istio-redirect (handle %d): %v", handle, err)
	}
	if NftStatus(a, nftTables(fw)) != Different {
		t.Fatal("nft status with a rule missing")
	}
	tp := Default()
	tp.Mode = ModeTProxy
	if NftStatus(BuildNft(tp, true), have) != Different || NftStatus(&RuleSet{}, have) != Different {
		t.Fatal("nft status with other rules")
	}
}

func TestFingerprintDependsOnRules(t *testing.T) {
	seen := map[string]string{}
	for name, c := range goldenCases() {
		for _, f := range []Family{V4, V6} {
			rs := Build(c, f)
			fp := rs.Fingerprint()
			text := fwtext.Text(Restore(rs, &State{}), false)
			if other, ok := seen[fp]; ok && other != text {
				t.Fatalf("%s %s: fingerprint %s shared by different rule sets", name, f, fp)
			}
			seen[fp] = text
		}
	}
}

func TestCapturedOutbound(t *testing.T) {
	c := Default()
	c.OutboundCIDRsExclude = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	c.OutboundPortsExclude = []uint16{3306}
	list := Default()
	list.OutboundCIDRs = CIDRs{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
	list.OutboundPorts = []uint16{9000}
	dns := Default()
	dns.RedirectDNS = true
	dns.DNSServers = []netip.Addr{netip.MustParseAddr("10.96.0.10")}
	for _, tc := range []struct {
		c    Config
		dst  string
		port uint16
		want bool
	}{
		{c, "10.2.3.4", 80, true},
		{c, "10.1.3.4", 80, false},
		{c, "10.2.3.4", 3306, false},
		{c, "127.0.0.1", 80, false},
		{list, "10.96.0.1", 80, true},
		{list, "10.0.0.1", 80, false},
		{list, "10.0.0.1", 9000, true},
		{dns, "10.96.0.10", 53, false},
		{dns, "10.96.0.11", 53, true},
		{Config{}, "10.0.0.1", 80, false},
	} {
		if got := tc.c.CapturedOutbound(netip.MustParseAddr(tc.dst), tc.port); got != tc.want {
			t.Errorf("%s:%d: captured %v, want %v", tc.dst, tc.port, got, tc.want)
		}
	}
}

func TestProbeTarget(t *testing.T) {
	c := Default()
	if a, err := ProbeTarget(c, V4, 15002); err != nil || a != netip.MustParseAddr("203.0.113.1") {
		t.Fatalf("all: %v %v", a, err)
	}
	c.OutboundCIDRs = CIDRs{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd70:96::/64")}}
	if a, err := ProbeTarget(c, V4, 15002); err != nil || a != netip.MustParseAddr("10.96.0.1") {
		t.Fatalf("list: %v %v", a, err)
	}
	if a, err := ProbeTarget(c, V6, 15002); err != nil || a != netip.MustParseAddr("fd70:96::1") {
		t.Fatalf("list v6: %v %v", a, err)
	}
	c.OutboundPortsExclude = []uint16{15002}
	if _, err := ProbeTarget(c, V4, 15002); err == nil {
		t.Fatal("excluded probe port accepted")
	}
}

func TestParseResolvConf(t *testing.T) {
	got := ParseResolvConf("# x\nsearch a.b\nnameserver 10.96.0.10\nnameserver fe80::1%eth0\nnameserver bogus\noptions ndots:5\nnameserver fd70::a\n")
	want := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fe80::1"), netip.MustParseAddr("fd70::a")}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v", got)
	}
}

func TestRouting(t *testing.T) {
	if s := Routing(Default(), false); len(s) != 0 {
		t.Fatalf("REDIRECT IPv4 needs no routing: %v", s)
	}
	tp := Default()
	tp.Mode = ModeTProxy
	if s := Routing(tp, true); len(s) != 5 || s[0].String() != "ip -4 rule add fwmark 0x539 lookup 133" {
		t.Fatalf("TPROXY dual stack: %v", s)
	}
}

func TestTProxyMarks(t *testing.T) {
	ctx := context.Background()
	c := Default()
	c.Mode = ModeTProxy
	c.TProxyMark = 0x64
	rs := Build(c, V4)
	for _, v := range []firewall.Variant{firewall.VariantLegacy, firewall.VariantNFT} {
		fw := fwfake.New(firewall.Backend{Kind: firewall.IPTables, Variant: v})
		if err := fw.Apply(ctx, Restore(rs, &State{})); err != nil {
			t.Fatal(err)
		}
		if got := TProxyMarks(fw.Table(ruleset.IP, Mangle)); !reflect.DeepEqual(got, []uint32{0x64}) {
			t.Fatalf("iptables-%s: %v", v, got)
		}
	}
	if got := TProxyMarks(nftFake(t, BuildNft(c, false)).Table(ruleset.Inet, "istio-proxy-mangle")); !reflect.DeepEqual(got, []uint32{0x64}) {
		t.Fatalf("nft: %v", got)
	}
	redirect := Build(Default(), V4)
	fw := fwfake.New(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantLegacy})
	if err := fw.Apply(ctx, Restore(redirect, &State{})); err != nil {
		t.Fatal(err)
	}
	if got := TProxyMarks(fw.Table(ruleset.IP, Mangle), fw.Table(ruleset.IP, NAT)); len(got) != 0 {
		t.Fatalf("REDIRECT: %v", got)
	}
}

// TestComparePartial: TPROXY's nat table written and its mangle table not
// (an install killed between the two tables' commits) is Partial for the
// same settings, which the next install completes, and Different for
// other settings.
func TestComparePartial(t *testing.T) {
	tp := Default()
	tp.Mode = ModeTProxy
	b := Build(tp, V4)
	full := saveOf(fwtext.Text(Restore(b, &State{}), false), "")
	i := strings.Index(full, "*mangle")
	if i < 0 {
		t.Fatalf("no mangle table in TPROXY's rules:\n%s", full)
	}
	j := strings.Index(full[i:], "COMMIT\n")
	natOnly := full[:i] + full[i+j+len("COMMIT\n"):]
	if got := Compare(b, stateOf(natOnly)); got != Partial {
		t.Fatalf("nat written, mangle not, compare with the same settings: %v", got)
	}
	other := tp
	other.ProxyPort = 15099
	if got := Compare(Build(other, V4), stateOf(natOnly)); got != Different {
		t.Fatalf("nat written, mangle not, compare with other settings: %v", got)
	}
	if got := Compare(b, stateOf(full)); got != Current {
		t.Fatalf("all written: %v", got)
	}
}
