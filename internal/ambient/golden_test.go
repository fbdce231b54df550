package ambient

import (
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/golden"
)

// TestGolden reviews the text of the rules as the tools get them
// (test/istio holds them to Istio's goldens in the kernel).
func TestGolden(t *testing.T) {
	node := Config{IPv6: true, RedirectDNS: true, ProbeSNAT: DefaultProbeSNAT, ProbeSNATv6: DefaultProbeSNATv6, KubeletUID: 1000}
	v4 := node
	v4.IPv6, v4.RedirectDNS = false, false
	for name, c := range map[string]struct {
		cfg Config
		pod Overrides
	}{
		"inpod-dns-ipv6":     {cfg: node},
		"inpod-ingress-virt": {cfg: v4, pod: Overrides{Ingress: true, VirtualInterfaces: []string{"k6t-eth0"}}},
		"inpod-dns-off-ipv6": {cfg: node, pod: Overrides{DNS: DNSOff}},
		"inpod-dns-on-ipv4":  {cfg: v4, pod: Overrides{DNS: DNSOn}},
	} {
		t.Run(name, func(t *testing.T) {
			var b strings.Builder
			b.WriteString("# iptables-restore --noflush\n" + fwtext.Text(InPodIPTables(c.cfg, c.pod), false))
			b.WriteString("# nft -f -\n" + fwtext.Text(InPodNft(c.cfg, c.pod), true))
			golden.Check(t, name, b.String())
		})
	}
	t.Run("host-ipv6", func(t *testing.T) {
		golden.Check(t, "host-ipv6", "# iptables-restore --noflush\n"+fwtext.Text(HostIPTables(node), false)+
			"# nft -f -\n"+fwtext.Text(HostNft(node), true))
	})
}

// TestProbeSetNames: the names istio-cni gives the probe sets.
func TestProbeSetNames(t *testing.T) {
	if ProbeSetName(4) != "istio-inpod-probes-v4" || ProbeSetName(6) != "istio-inpod-probes-v6" {
		t.Errorf("probe sets %s, %s", ProbeSetName(4), ProbeSetName(6))
	}
}
