package firewall

import (
	"os/exec"
	"testing"

	"github.com/meshwire/meshwire/internal/ruleset"
)

func TestParse(t *testing.T) {
	cases := map[string]string{
		"iptables": "iptables", "IPTABLES": "iptables", "legacy": "iptables-legacy",
		"iptables-legacy": "iptables-legacy", "nft": "iptables-nft", "iptables-nft": "iptables-nft",
		"nftables": "nftables",
	}
	for in, want := range cases {
		b, err := Parse(in)
		if err != nil || b.String() != want {
			t.Errorf("Parse(%q) = %v, %v; want %s", in, b, err, want)
		}
	}
	if _, err := Parse("ipchains"); err == nil {
		t.Error("Parse(ipchains) succeeded")
	}
}

func TestTools(t *testing.T) {
	cases := []struct {
		b    Backend
		f    ruleset.IPVersion
		want string
	}{
		{Backend{Kind: IPTables}, ruleset.V4, "iptables-restore"},
		{Backend{Kind: IPTables}, ruleset.V6, "ip6tables-restore"},
		{Backend{Kind: IPTables, Variant: VariantLegacy}, ruleset.V4, "iptables-legacy-restore"},
		{Backend{Kind: IPTables, Variant: VariantNFT}, ruleset.V6, "ip6tables-nft-restore"},
	}
	for _, c := range cases {
		if got := c.b.tool(c.f, "restore"); got != c.want {
			t.Errorf("%v family %d: %s, want %s", c.b, c.f, got, c.want)
		}
	}
}

func TestCountRules(t *testing.T) {
	save := "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j X\n-A X -j RETURN\nCOMMIT\n"
	if n := CountRules(save); n != 2 {
		t.Fatalf("CountRules = %d, want 2", n)
	}
	if n := CountRules("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"); n != 0 {
		t.Fatalf("CountRules of empty tables = %d", n)
	}
}

func TestHasNativeTables(t *testing.T) {
	if hasNativeTables("table ip nat\ntable ip6 filter\ntable ip mangle\n") {
		t.Error("iptables-nft tables taken for native nftables")
	}
	if !hasNativeTables("table ip nat\ntable inet firewalld\n") {
		t.Error("inet table not seen as native")
	}
	if !hasNativeTables("table ip kube-proxy\n") {
		t.Error("ip kube-proxy table not seen as native")
	}
	if hasNativeTables("") {
		t.Error("empty ruleset seen as native")
	}
}

// TestLockBusy: exit status 4 of an iptables tool is a busy xtables lock
// (CNI code 11, try again) only with the lock's message; iptables-nft's
// failed commit exits 4 too, and is no lock.
func TestLockBusy(t *testing.T) {
	exit4 := exec.Command("sh", "-c", "exit 4").Run()
	exit1 := exec.Command("sh", "-c", "exit 1").Run()
	for _, tc := range []struct {
		name, tool, stderr string
		err                error
		busy               bool
	}{
		{"the lock held", "iptables-legacy-restore", "Can't lock /run/xtables.lock: Resource temporarily unavailable\nAnother app is currently holding the xtables lock. Stopped waiting after 1s.", exit4, true},
		{"a chain gone under a commit", "iptables-nft-restore", "iptables-restore v1.8.9 (nf_tables): \nline 4: RULE_APPEND failed (No such file or directory): rule in chain MWHP-acd604bb7494882c", exit4, false},
		{"another failure with the lock's words", "iptables-legacy-restore", "Another app is currently holding the xtables lock.", exit1, false},
		{"nft", "nft", "xtables lock", exit4, false},
	} {
		if got := lockBusy(tc.tool, tc.err, tc.stderr); got != tc.busy {
			t.Errorf("%s: lockBusy = %v, want %v", tc.name, got, tc.busy)
		}
	}
}
