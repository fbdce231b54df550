//go:build kernel

package firewall

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// detectWithTools is Detect as the tools alone answer it (what Detect did
// before it looked over netlink): the reference its answers are held to.
func detectWithTools(ctx context.Context) Backend {
	for _, v := range []Variant{VariantLegacy, VariantNFT} {
		b := Backend{Kind: IPTables, Variant: v}
		for _, f := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
			if _, err := exec.LookPath(b.tool(f, "save")); err != nil {
				continue
			}
			if out, err := b.Save(ctx, f, ""); err == nil && CountRules(out) > 0 {
				return b
			}
		}
	}
	if out, err := Nft(ctx, "list", "tables"); err == nil && hasNativeTables(out) {
		return Backend{Kind: NFTables}
	}
	return Backend{Kind: IPTables}
}

// TestDetectMatchesTheTools: in namespaces set up as nodes and pods are,
// Detect answers what the tools answer.
func TestDetectMatchesTheTools(t *testing.T) {
	kerneltest.Require(t)
	for _, tool := range []string{"iptables-legacy", "iptables-nft", "ip6tables-nft", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (make test installs it: test/deps.sh)", tool)
		}
	}
	ctx := context.Background()
	for i, tc := range []struct {
		name  string
		setup []string
		want  Backend
	}{
		{"empty", nil, Backend{Kind: IPTables}},
		{"legacy rule", []string{"iptables-legacy -t nat -A OUTPUT -j RETURN"}, Backend{Kind: IPTables, Variant: VariantLegacy}},
		{"legacy table loaded, no rule", []string{"iptables-legacy -t nat -S", "ip6tables-legacy -t mangle -N X"}, Backend{Kind: IPTables}},
		{"iptables-nft IPv6 rule", []string{"ip6tables-nft -t mangle -A OUTPUT -j RETURN"}, Backend{Kind: IPTables, Variant: VariantNFT}},
		{"iptables-nft chain, no rule", []string{"iptables-nft -t nat -N X"}, Backend{Kind: IPTables}},
		{"native inet table", []string{"nft add table inet x"}, Backend{Kind: NFTables}},
		{"native arp table", []string{"nft add table arp x"}, Backend{Kind: NFTables}},
		{"native table named nat", []string{"nft add table ip nat"}, Backend{Kind: IPTables}},
		{"rule in a native table named nat", []string{"nft add table ip nat", "nft add chain ip nat c", "nft add rule ip nat c return"}, Backend{Kind: IPTables, Variant: VariantNFT}},
		{"legacy rule and native table", []string{"nft add table ip6 x", "ip6tables-legacy -A INPUT -j ACCEPT"}, Backend{Kind: IPTables, Variant: VariantLegacy}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, p := kerneltest.NewNS(t, fmt.Sprintf("fwdetect%d", i))
			for _, cmd := range tc.setup {
				args := append([]string{"netns", "exec", name}, strings.Fields(cmd)...)
				if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
					t.Fatalf("%s: %v: %s", cmd, err, out)
				}
			}
			var got, tools Backend
			err := netns.Enter(p, func() error {
				got = Detect(ctx)
				tools = detectWithTools(ctx)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || tools != tc.want {
				t.Fatalf("Detect = %s, the tools say %s, want %s", got, tools, tc.want)
			}
		})
	}
}
