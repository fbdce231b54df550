package ruleset

import (
	"net/netip"
	"strings"
	"testing"
)

// TestRender: each match and target, as iptables-restore arguments (in
// iptables-save's order: addresses, interfaces, protocol, then modules) and
// as an nft statement (in the rule's order).
func TestRender(t *testing.T) {
	p := netip.MustParsePrefix
	upper := func(c string) string { return strings.ToUpper(c) }
	for _, tc := range []struct {
		r        Rule
		ipt, nft string
	}{
		{Rule{Match: []Match{{Kind: MatchOut, Name: "lo"}, {Kind: MatchProto, Name: "tcp"}, {Kind: MatchDst, Prefix: p("127.0.0.1/32"), Not: true},
			{Kind: MatchDPort, Name: "tcp", Ports: []uint16{53, 15008}, Not: true}, {Kind: MatchUID, Value: 1337}}, Target: Target{Kind: Jump, Chain: "in"}},
			"! -d 127.0.0.1/32 -o lo -p tcp -m multiport ! --dports 53,15008 -m owner --uid-owner 1337 -j in",
			`oifname "lo" meta l4proto tcp ip daddr != 127.0.0.1/32 tcp dport != { 53, 15008 } meta skuid 1337 counter jump IN`},
		{Rule{Match: []Match{{Kind: MatchDPort, Name: "udp", Ports: []uint16{53}}, {Kind: MatchDst, Prefix: p("fd00:1::a/128")}}, Target: Target{Kind: CTZone, Zone: 2}},
			"-d fd00:1::a/128 -p udp -m udp --dport 53 -j CT --zone 2",
			"udp dport 53 ip6 daddr fd00:1::a/128 counter ct zone set 2"},
		{Rule{Match: []Match{{Kind: MatchIn, Name: "lo"}, {Kind: MatchMark, Value: 1338, Not: true}, {Kind: MatchGID, Value: 7, Not: true}}, Target: Target{Kind: Return}},
			"-i lo -m mark ! --mark 0x53a -m owner ! --gid-owner 7 -j RETURN",
			`iifname "lo" meta mark != 0x53a meta skgid != 7 counter return`},
		{Rule{Family: V6, Match: []Match{{Kind: MatchProto, Name: "tcp"}}, Target: Target{Kind: TProxy, Port: 15006, Mark: 1337}},
			"-p tcp -j TPROXY --on-port 15006 --tproxy-mark 0x539/0xffffffff",
			"meta l4proto tcp tproxy ip6 to :15006 meta mark set 0x539 counter accept"},
		{Rule{Match: []Match{{Kind: MatchCTState, Name: "RELATED,ESTABLISHED"}, {Kind: MatchCTDir, Name: "REPLY"}, {Kind: MatchSPort, Name: "udp", Ports: []uint16{53}}},
			Target: Target{Kind: SetMark, Mark: 1}},
			"-p udp -m conntrack --ctstate RELATED,ESTABLISHED -m conntrack --ctdir REPLY -m udp --sport 53 -j MARK --set-xmark 0x1/0xffffffff",
			"ct state related,established ct direction reply udp sport 53 counter meta mark set 0x1"},
		{Rule{Match: []Match{{Kind: MatchConnMark, Value: 1337}}, Target: Target{Kind: ConnmarkRestore}},
			"-m connmark --mark 0x539 -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff",
			"ct mark 0x539 counter meta mark set ct mark"},
		{Rule{Match: []Match{{Kind: MatchSrc, Prefix: p("127.0.0.6/32")}}, Target: Target{Kind: Redirect, Port: 15053}},
			"-s 127.0.0.6/32 -j REDIRECT --to-ports 15053",
			"ip saddr 127.0.0.6/32 counter redirect to :15053"},
		{Rule{Target: Target{Kind: ConnmarkSave}}, "-j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff", "counter ct mark set meta mark"},
		{Rule{Target: Target{Kind: Drop}}, "-j DROP", "counter drop"},
		{Rule{Target: Target{Kind: Accept}}, "-j ACCEPT", "counter accept"},
	} {
		if got := strings.Join(tc.r.IPTables(), " "); got != tc.ipt {
			t.Errorf("IPTables:\n got %s\nwant %s", got, tc.ipt)
		}
		if got := tc.r.NFT(upper); got != tc.nft {
			t.Errorf("NFT:\n got %s\nwant %s", got, tc.nft)
		}
	}
}

func TestFamilies(t *testing.T) {
	for _, f := range []Family{IP, IP6, Inet, Bridge, ARP, Netdev} {
		if g, err := ParseFamily(f.String()); err != nil || g != f {
			t.Errorf("%s: %v %v", f, g, err)
		}
	}
	if _, err := ParseFamily("ipx"); err == nil {
		t.Error("ipx parsed")
	}
	if V6.Tables() != IP6 || V4.Tables() != IP || V4.String() != "IPv4" {
		t.Error("IP versions")
	}
}
