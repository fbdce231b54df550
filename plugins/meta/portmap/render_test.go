package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/golden"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// goldenCases are the configs whose rendered rules are reviewed as golden
// files: every option that changes a rule.
var goldenCases = []struct {
	name string
	conf string // plugin keys besides cniVersion/name/type
}{
	{"basic", `"runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80,"protocol":"tcp"}]}`},
	{"tcp-udp-sctp-hostip", `"runtimeConfig":{"portMappings":[
		{"hostPort":30080,"containerPort":80,"protocol":"tcp"},
		{"hostPort":30081,"containerPort":81,"protocol":"UDP","hostIP":"198.18.48.1"},
		{"hostPort":30082,"containerPort":82,"protocol":"sctp","hostIP":"fd50:48::1"},
		{"hostPort":30083,"containerPort":83,"protocol":"tcp","hostIP":"0.0.0.0"}]}`},
	{"snat-off", `"snat":false,"runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80,"protocol":"tcp"}]}`},
	{"masq-all", `"masqAll":true,"runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80,"protocol":"udp"}]}`},
	{"mark-bit-20", `"markMasqBit":20,"runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80,"protocol":"tcp"}]}`},
	{"external-mark", `"externalSetMarkChain":"KUBE-MARK-MASQ","runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80,"protocol":"tcp"}]}`},
	{"iptables-conditions", `"backend":"iptables","conditionsV4":["-m","comment","--comment","two words","!","-s","198.18.49.0/24"],"conditionsV6":["!","-s","fd50:49::/64"],"runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80,"protocol":"tcp"}]}`},
	{"nft-conditions", `"backend":"nftables","conditionsV4":["ip saddr != 198.18.49.0/24"],"conditionsV6":["ip6","saddr","!=","fd50:49::/64"],"runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80,"protocol":"tcp"}]}`},
}

var goldenAtt = attachment.ID{ContainerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", IfName: "eth0", Network: "mwtp-golden"}

func goldenPlans(t *testing.T, conf string) (*config, []famPlan) {
	t.Helper()
	c, err := parseConfig([]byte(`{"cniVersion":"1.1.0","name":"mwtp-golden","type":"portmap",` + conf + `}`))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	v4 := &net.IPNet{IP: net.ParseIP("198.18.48.5").To4(), Mask: net.CIDRMask(24, 32)}
	v6 := &net.IPNet{IP: net.ParseIP("fd50:48::5"), Mask: net.CIDRMask(64, 128)}
	return c, plan(c, goldenAtt, v4, v6)
}

// TestGolden renders every backend's payloads for each case: the
// single-transaction ADD, the slow-path ADD on an empty table, DEL, and
// the removal of the last attachment with the base.
func TestGolden(t *testing.T) {
	for _, gc := range goldenCases {
		t.Run(gc.name, func(t *testing.T) {
			c, plans := goldenPlans(t, gc.conf)
			var b strings.Builder
			kind := firewall.IPTables
			if c.Backend != nil {
				kind = c.Backend.Kind
			} else if c.Implied != "" {
				kind = c.Implied
			}
			if kind == firewall.IPTables {
				for _, p := range plans {
					fmt.Fprintf(&b, "## iptables IPv%d: ADD (new attachment)\n%s\n", p.Family, fwtext.Text(renderIPTAddNew(p), false))
					var empty *installed.Table // no nat table read
					fmt.Fprintf(&b, "## iptables IPv%d: ADD (first attachment, no meshwire chain yet)\n%s\n", p.Family, fwtext.Text(renderIPTAddFresh(p), false))
					fmt.Fprintf(&b, "## iptables IPv%d: ADD (slow path, empty table)\n%s\n", p.Family, fwtext.Text(renderIPTEnsure(empty, p), false))
					applied := applyIPT(t, p, renderIPTEnsure(empty, p))
					fmt.Fprintf(&b, "## iptables IPv%d: ADD (slow path, repeated)\n%s\n", p.Family, fwtext.Text(renderIPTEnsure(applied, p), false))
					fmt.Fprintf(&b, "## iptables IPv%d: DEL\n%s\n", p.Family, fwtext.Text(renderIPTDel(p.Family, p.Key), false))
					fmt.Fprintf(&b, "## iptables IPv%d: remove the last attachment and the base\n%s\n", p.Family, fwtext.Text(renderIPTRemove(p.Family, applied, []string{p.Key}, true), false))
				}
			}
			if kind == firewall.NFTables || c.Backend == nil && c.Implied == "" {
				fmt.Fprintf(&b, "## nftables: ADD (new attachment)\n%s\n", fwtext.Text(renderNFTAddNew(goldenAtt, plans), true))
				var empty *installed.Table // no table
				fmt.Fprintf(&b, "## nftables: ADD (first attachment, no table yet)\n%s\n", fwtext.Text(renderNFTAddFresh(goldenAtt, plans), true))
				fmt.Fprintf(&b, "## nftables: ADD (slow path, empty table)\n%s\n", fwtext.Text(renderNFTEnsure(empty, goldenAtt, plans), true))
				st := nftListing(goldenAtt.PortmapKey(), plans)
				fmt.Fprintf(&b, "## nftables: DEL of the last attachment\n%s\n", fwtext.Text(renderNFTRemove(st, []string{goldenAtt.PortmapKey()}, true), true))
			}
			golden.Check(t, gc.name, b.String())
		})
	}
}

// applyIPT is the nat table of p's family after tx, as an nf_tables-backed
// iptables reads it back (typed rules, no text: the removal then renders
// its -D lines from the typed fields). The node has the external marking
// chain p uses, if any.
func applyIPT(t *testing.T, p famPlan, tx *ruleset.Tx) *installed.Table {
	t.Helper()
	f := p.Family
	fake := fwfake.New(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT})
	if p.ExternalMark != "" {
		ext := (&ruleset.Tx{}).CreateChain(iptNat(f), ruleset.Chain{Name: p.ExternalMark})
		if err := fake.Apply(context.Background(), ext); err != nil {
			t.Fatal(err)
		}
	}
	if err := fake.Apply(context.Background(), tx); err != nil {
		t.Fatalf("apply:\n%s\n%v", fwtext.Text(tx, false), err)
	}
	return fake.Table(f.Tables(), "nat")
}

// nftListing is the table as read back after the attachment's ADD.
func nftListing(key string, plans []famPlan) *installed.Table {
	return tableOf(nftTable,
		&installed.Chain{Name: nftHostports, Rules: []installed.Rule{{Chain: nftHostports, Jump: nftAttChain(key), Handle: 7}}},
		&installed.Chain{Name: nftAttChain(key), Comment: tag(goldenAtt, nftCommentMax)},
		&installed.Chain{Name: nftAnchor})
}
