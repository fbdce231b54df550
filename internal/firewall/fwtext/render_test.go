package fwtext

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// TestRender: each match and target, as iptables-restore arguments (in
// iptables-save's order: addresses, interfaces, protocol, then modules) and
// as an nft statement (in the rule's order).
func TestRender(t *testing.T) {
	p := netip.MustParsePrefix
	upper := func(c string) string { return strings.ToUpper(c) }
	for _, tc := range []struct {
		r        ruleset.Rule
		ipt, nft string
	}{
		{ruleset.Rule{Match: []ruleset.Match{{Kind: ruleset.MatchOut, Name: "lo"}, {Kind: ruleset.MatchProto, Name: "tcp"}, {Kind: ruleset.MatchDst, Prefix: p("127.0.0.1/32"), Not: true},
			{Kind: ruleset.MatchDPort, Name: "tcp", Ports: []uint16{53, 15008}, Not: true}, {Kind: ruleset.MatchUID, Value: 1337}}, Target: ruleset.Target{Kind: ruleset.Jump, Chain: "in"}},
			"! -d 127.0.0.1/32 -o lo -p tcp -m multiport ! --dports 53,15008 -m owner --uid-owner 1337 -j in",
			`oifname "lo" meta l4proto tcp ip daddr != 127.0.0.1/32 tcp dport != { 53, 15008 } meta skuid 1337 counter jump IN`},
		{ruleset.Rule{Match: []ruleset.Match{{Kind: ruleset.MatchDPort, Name: "udp", Ports: []uint16{53}}, {Kind: ruleset.MatchDst, Prefix: p("fd00:1::a/128")}}, Target: ruleset.Target{Kind: ruleset.CTZone, Zone: 2}},
			"-d fd00:1::a/128 -p udp -m udp --dport 53 -j CT --zone 2",
			"udp dport 53 ip6 daddr fd00:1::a/128 counter ct zone set 2"},
		{ruleset.Rule{Match: []ruleset.Match{{Kind: ruleset.MatchIn, Name: "lo"}, {Kind: ruleset.MatchMark, Value: 1338, Not: true}, {Kind: ruleset.MatchGID, Value: 7, Not: true}}, Target: ruleset.Target{Kind: ruleset.Return}},
			"-i lo -m mark ! --mark 0x53a -m owner ! --gid-owner 7 -j RETURN",
			`iifname "lo" meta mark != 0x53a meta skgid != 7 counter return`},
		{ruleset.Rule{Family: ruleset.V6, Match: []ruleset.Match{{Kind: ruleset.MatchProto, Name: "tcp"}}, Target: ruleset.Target{Kind: ruleset.TProxy, Port: 15006, Mark: 1337}},
			"-p tcp -j TPROXY --on-port 15006 --tproxy-mark 0x539/0xffffffff",
			"meta l4proto tcp tproxy ip6 to :15006 meta mark set 0x539 counter accept"},
		{ruleset.Rule{Match: []ruleset.Match{{Kind: ruleset.MatchCTState, Name: "RELATED,ESTABLISHED"}, {Kind: ruleset.MatchCTDir, Name: "REPLY"}, {Kind: ruleset.MatchSPort, Name: "udp", Ports: []uint16{53}}},
			Target: ruleset.Target{Kind: ruleset.SetMark, Mark: 1}},
			"-p udp -m conntrack --ctstate RELATED,ESTABLISHED -m conntrack --ctdir REPLY -m udp --sport 53 -j MARK --set-xmark 0x1/0xffffffff",
			"ct state related,established ct direction reply udp sport 53 counter meta mark set 0x1"},
		{ruleset.Rule{Match: []ruleset.Match{{Kind: ruleset.MatchConnMark, Value: 1337}}, Target: ruleset.Target{Kind: ruleset.ConnmarkRestore}},
			"-m connmark --mark 0x539 -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff",
			"ct mark 0x539 counter meta mark set ct mark"},
		{ruleset.Rule{Match: []ruleset.Match{{Kind: ruleset.MatchSrc, Prefix: p("127.0.0.6/32")}}, Target: ruleset.Target{Kind: ruleset.Redirect, Port: 15053}},
			"-s 127.0.0.6/32 -j REDIRECT --to-ports 15053",
			"ip saddr 127.0.0.6/32 counter redirect to :15053"},
		{ruleset.Rule{Target: ruleset.Target{Kind: ruleset.ConnmarkSave}}, "-j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff", "counter ct mark set meta mark"},
		{ruleset.Rule{Match: []ruleset.Match{{Kind: ruleset.MatchMark, Value: 0x539, Mask: 0xfff}}, Target: ruleset.Target{Kind: ruleset.ConnmarkSet, Mark: 0x111, Mask: 0xfff}},
			"-m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff",
			"meta mark & 0x00000fff == 0x00000539 counter ct mark set ct mark & 0xfffff000 | 0x00000111"},
		{ruleset.Rule{Match: []ruleset.Match{{Kind: ruleset.MatchConnMark, Value: 0x111, Mask: 0xfff}}, Target: ruleset.Target{Kind: ruleset.ConnmarkRestore}},
			"-m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff",
			"ct mark & 0x00000fff == 0x00000111 counter meta mark set ct mark"},
		{ruleset.Rule{Match: []ruleset.Match{{Kind: ruleset.MatchProto, Name: "tcp"}, {Kind: ruleset.MatchProtoModule, Name: "tcp"}, {Kind: ruleset.MatchSrc, Prefix: p("169.254.7.127/32"), Host: true}},
			Target: ruleset.Target{Kind: ruleset.Accept}},
			"-s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT",
			"meta l4proto tcp ip saddr 169.254.7.127 counter accept"},
		{ruleset.Rule{Family: ruleset.V6, Match: []ruleset.Match{{Kind: ruleset.MatchSocketExists}, {Kind: ruleset.MatchProto, Name: "tcp"}, {Kind: ruleset.MatchDstSet, Name: "probes-v6"}},
			Target: ruleset.Target{Kind: ruleset.SNAT, To: netip.MustParseAddrPort("[fd16::1]:0")}},
			"-p tcp -m owner --socket-exists -m set --match-set probes-v6 dst -j SNAT --to-source fd16::1",
			"meta l4proto tcp ip6 daddr @probes-v6 counter snat ip6 to fd16::1"},
		{ruleset.Rule{Target: ruleset.Target{Kind: ruleset.Drop}}, "-j DROP", "counter drop"},
		{ruleset.Rule{Target: ruleset.Target{Kind: ruleset.Accept}}, "-j ACCEPT", "counter accept"},
	} {
		if got := strings.Join(IPTablesArgs(tc.r), " "); got != tc.ipt {
			t.Errorf("IPTables:\n got %s\nwant %s", got, tc.ipt)
		}
		if got := NftRule(tc.r, upper); got != tc.nft {
			t.Errorf("NFT:\n got %s\nwant %s", got, tc.nft)
		}
	}
}
