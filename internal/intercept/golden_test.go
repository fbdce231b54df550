package intercept

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/golden"
)

// goldenCases are the flag combinations whose rendered rules are reviewed
// as golden files.
func goldenCases() map[string]Config {
	cases := map[string]Config{}
	add := func(name string, mod func(*Config)) {
		c := Default()
		mod(&c)
		cases[name] = c
	}
	add("default", func(c *Config) {})
	add("tproxy", func(c *Config) { c.Mode = ModeTProxy })
	add("tproxy-mark-table", func(c *Config) { c.Mode = ModeTProxy; c.TProxyMark = 0x100; c.TProxyRouteTable = 200 })
	add("ports", func(c *Config) { c.ProxyPort, c.InboundCapturePort, c.InboundTunnelPort = 16001, 16006, 0 })
	add("inbound-list", func(c *Config) { c.InboundPorts = Ports{Ports: []uint16{80, 8080}} })
	add("inbound-list-tproxy", func(c *Config) { c.Mode = ModeTProxy; c.InboundPorts = Ports{Ports: []uint16{80, 8080}} })
	add("inbound-none", func(c *Config) { c.InboundPorts = Ports{} })
	add("inbound-exclude", func(c *Config) { c.InboundPortsExclude = []uint16{15090, 15021, 15020} })
	add("inbound-exclude-tproxy", func(c *Config) { c.Mode = ModeTProxy; c.InboundPortsExclude = []uint16{15090, 15021} })
	add("outbound-cidrs", func(c *Config) {
		c.OutboundCIDRs = CIDRs{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd70:96::/108")}}
	})
	add("outbound-none", func(c *Config) { c.OutboundCIDRs = CIDRs{} })
	add("outbound-include-loopback", func(c *Config) {
		c.OutboundCIDRs = CIDRs{Prefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}}
	})
	add("outbound-exclude", func(c *Config) {
		c.OutboundCIDRsExclude = []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32"), netip.MustParsePrefix("fd70:1::/64")}
		c.OutboundPortsExclude = []uint16{3306, 6379}
		c.OutboundPorts = []uint16{9000}
	})
	add("uids-gids", func(c *Config) { c.ProxyUIDs = []uint32{1337, 1338}; c.ProxyGIDs = []uint32{2000} })
	add("interfaces", func(c *Config) {
		c.KubeVirtInterfaces = []string{"k6t-eth0"}
		c.ExcludeInterfaces = []string{"net1", "net2"}
	})
	add("interfaces-tproxy", func(c *Config) {
		c.Mode = ModeTProxy
		c.KubeVirtInterfaces = []string{"k6t-eth0"}
		c.ExcludeInterfaces = []string{"net1"}
		c.OutboundCIDRs = CIDRs{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
		c.OutboundCIDRsExclude = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	})
	add("dns", func(c *Config) {
		c.RedirectDNS = true
		c.DNSServers = []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd70:96::a")}
	})
	add("dns-capture-all", func(c *Config) { c.RedirectDNS = true; c.CaptureAllDNS = true })
	add("dns-capture-all-tproxy", func(c *Config) { c.RedirectDNS = true; c.CaptureAllDNS = true; c.Mode = ModeTProxy })
	add("drop-invalid", func(c *Config) { c.DropInvalid = true })
	// ISTIO_OUTBOUND_OWNER_GROUPS=1000,202 (with DNS, whose nat chain
	// filters the same groups), ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE=888,889,
	// and ISTIO_OUTBOUND_OWNER_GROUPS="" (nobody's connections).
	add("owner-groups", func(c *Config) {
		c.OutboundGroups = GroupFilter{Only: true, GIDs: []uint32{1000, 202}}
		c.RedirectDNS, c.CaptureAllDNS = true, true
	})
	add("owner-groups-exclude", func(c *Config) { c.OutboundGroups = GroupFilter{GIDs: []uint32{888, 889}} })
	add("owner-groups-none", func(c *Config) { c.OutboundGroups = GroupFilter{Only: true} })
	// ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR=127.0.0.0/8 (IPv6 keeps ::1/128).
	add("loopback-cidr-tproxy", func(c *Config) {
		c.Mode = ModeTProxy
		c.IPv4Loopback = netip.MustParsePrefix("127.0.0.0/8")
	})
	return cases
}

func render(c Config) string {
	var b strings.Builder
	v4, v6 := Build(c, V4), Build(c, V6)
	for _, rs := range []*RuleSet{v4, v6} {
		b.WriteString("# iptables-restore --noflush, " + rs.Family.String() + " (fresh install)\n")
		b.WriteString(fwtext.Text(Restore(rs, &State{}), false))
	}
	b.WriteString("# nft -f -\n")
	b.WriteString(fwtext.Text(Nft(BuildNft(c, true)), true))
	b.WriteString("# policy routing\n")
	for _, step := range Routing(c, true) {
		b.WriteString(step.String() + "\n")
	}
	return b.String()
}

func TestGolden(t *testing.T) {
	for name, c := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			golden.Check(t, name, render(c))
		})
	}
}
