package main

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ruleset"
)

func conf(keys string) []byte {
	if keys != "" {
		keys = "," + keys
	}
	return []byte(`{"cniVersion":"1.1.0","name":"n","type":"portmap"` + keys + `}`)
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(conf(`"runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !c.SNAT || c.MasqAll || c.MarkBit != 13 || c.Backend != nil || c.Implied != "" || c.ExternalSetMarkChain != "" {
		t.Fatalf("defaults: %+v", c)
	}
	if len(c.Mappings) != 1 || c.Mappings[0].Protocol != "tcp" || c.Mappings[0].HostIP != nil {
		t.Fatalf("mapping defaults: %+v", c.Mappings)
	}
}

func TestParseConfigErrors(t *testing.T) {
	cases := []struct {
		name, keys string
		code       uint
		mentions   []string
	}{
		{"mark bit and external chain", `"markMasqBit":13,"externalSetMarkChain":"KUBE-MARK-MASQ"`, 7, []string{"markMasqBit", "externalSetMarkChain"}},
		{"mark bit high", `"markMasqBit":32`, 7, []string{"markMasqBit"}},
		{"mark bit negative", `"markMasqBit":-1`, 7, []string{"markMasqBit"}},
		{"mark bit not a number", `"markMasqBit":"13"`, 7, []string{"markMasqBit"}},
		{"bad backend", `"backend":"pf"`, 7, []string{"backend"}},
		{"nftables with external chain", `"backend":"nftables","externalSetMarkChain":"X"`, 7, []string{"nftables", "externalSetMarkChain"}},
		{"iptables with nft conditions", `"backend":"iptables","conditionsV4":["ip saddr 1.2.3.4"]`, 7, []string{"iptables", "conditionsV4"}},
		{"nftables with iptables conditions", `"backend":"nftables","conditionsV6":["-s","::1"]`, 7, []string{"nftables", "conditionsV6"}},
		{"mixed conditions", `"conditionsV4":["-s","1.2.3.4"],"conditionsV6":["ip6 saddr ::1"]`, 7, []string{"conditionsV4", "conditionsV6"}},
		{"external chain with nft conditions", `"externalSetMarkChain":"X","conditionsV4":["ip saddr 1.2.3.4"]`, 7, []string{"externalSetMarkChain", "conditionsV4"}},
		{"condition injection", `"conditionsV4":["-s 1.2.3.4\n-A INPUT -j DROP"]`, 7, []string{"conditionsV4[0]"}},
		{"nft condition injection", `"conditionsV4":["ip saddr 1.2.3.4; delete table inet x"]`, 7, []string{"conditionsV4[0]"}},
		{"bad external chain", `"externalSetMarkChain":"has space"`, 7, []string{"externalSetMarkChain"}},
		{"host port zero", `"runtimeConfig":{"portMappings":[{"hostPort":0,"containerPort":80,"protocol":"tcp"}]}`, 7, []string{"portMappings[0].hostPort"}},
		{"host port high", `"runtimeConfig":{"portMappings":[{"hostPort":70000,"containerPort":80,"protocol":"tcp"}]}`, 7, []string{"portMappings[0].hostPort"}},
		{"container port", `"runtimeConfig":{"portMappings":[{"hostPort":1,"containerPort":1},{"hostPort":30080,"containerPort":-3}]}`, 7, []string{"portMappings[1].containerPort"}},
		{"protocol", `"runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80,"protocol":"icmp"}]}`, 7, []string{"portMappings[0].protocol"}},
		{"host ip", `"runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80,"hostIP":"localhost"}]}`, 7, []string{"portMappings[0].hostIP"}},
		{"host port string", `"runtimeConfig":{"portMappings":[{"hostPort":"80","containerPort":80}]}`, 7, []string{"hostPort"}},
		{"snat not bool", `"snat":"yes"`, 7, []string{"snat"}},
		{"not json", `]`, 6, nil},
		{"wrong type", `"type":"bridge"`, 7, []string{"type"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := conf(tc.keys)
			if tc.name == "wrong type" {
				data = []byte(`{"cniVersion":"1.1.0","name":"n","type":"bridge"}`)
			}
			_, err := parseConfig(data)
			var e *types.Error
			if !errors.As(err, &e) || e.Code != tc.code {
				t.Fatalf("got %v, want code %d", err, tc.code)
			}
			for _, m := range tc.mentions {
				if !strings.Contains(e.Msg, m) {
					t.Fatalf("message %q does not name %q", e.Msg, m)
				}
			}
		})
	}
}

func TestBackendChoice(t *testing.T) {
	cases := []struct {
		keys    string
		backend string // "" = auto
		implied firewall.Kind
	}{
		{``, "", ""},
		{`"backend":"iptables"`, "iptables", ""},
		{`"backend":"nftables"`, "nftables", ""},
		{`"backend":"iptables-legacy"`, "iptables-legacy", ""},
		{`"externalSetMarkChain":"KUBE-MARK-MASQ"`, "", firewall.IPTables},
		{`"conditionsV4":["-d","198.18.48.1"]`, "", firewall.IPTables},
		{`"conditionsV6":["ip6 daddr fd50::1"]`, "", firewall.NFTables},
		{`"conditionsV4":[""]`, "", ""},
		{`"backend":"nftables","conditionsV4":["ip daddr 198.18.48.1"]`, "nftables", ""},
	}
	for _, tc := range cases {
		c, err := parseConfig(conf(tc.keys))
		if err != nil {
			t.Fatalf("%s: %v", tc.keys, err)
		}
		got := ""
		if c.Backend != nil {
			got = c.Backend.String()
		}
		if got != tc.backend || c.Implied != tc.implied {
			t.Errorf("%s: backend %q implied %q, want %q %q", tc.keys, got, c.Implied, tc.backend, tc.implied)
		}
	}
}

func TestContainerAddrs(t *testing.T) {
	r := &current.Result{
		Interfaces: []*current.Interface{{Name: "mwtp0"}, {Name: "veth1"}, {Name: "eth0", Sandbox: "/run/netns/x"}, {Name: "net1", Sandbox: "/run/netns/x"}},
		IPs: []*current.IPConfig{
			{Interface: current.Int(0), Address: mustCIDR("198.18.48.1/24")},
			{Interface: current.Int(3), Address: mustCIDR("198.18.60.5/24")},
			{Interface: current.Int(2), Address: mustCIDR("198.18.48.5/24")},
			{Interface: current.Int(2), Address: mustCIDR("198.18.48.6/24")},
			{Address: mustCIDR("fd50:48::5/64")},
		},
	}
	v4, v6 := containerAddrs(r, "eth0")
	if v4 == nil || v4.String() != "198.18.48.5/24" || len(v4.IP) != 4 {
		t.Fatalf("v4 = %v", v4)
	}
	if v6 == nil || v6.String() != "fd50:48::5/64" {
		t.Fatalf("v6 = %v", v6)
	}
	if v4, v6 := containerAddrs(r, "eth9"); v4 != nil || v6 == nil {
		t.Fatalf("eth9: %v %v (only the interface-less v6 address applies)", v4, v6)
	}
	if v4, v6 := containerAddrs(nil, "eth0"); v4 != nil || v6 != nil {
		t.Fatal("nil result gave addresses")
	}
}

func mustCIDR(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return *n
}

func TestPlan(t *testing.T) {
	c, err := parseConfig(conf(`"runtimeConfig":{"portMappings":[
		{"hostPort":30080,"containerPort":80,"protocol":"tcp"},
		{"hostPort":30081,"containerPort":81,"protocol":"udp","hostIP":"198.18.48.1"},
		{"hostPort":30082,"containerPort":82,"protocol":"tcp","hostIP":"::"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	v4 := &net.IPNet{IP: net.ParseIP("198.18.48.5").To4(), Mask: net.CIDRMask(24, 32)}
	v6 := &net.IPNet{IP: net.ParseIP("fd50:48::5"), Mask: net.CIDRMask(64, 128)}
	a := attachment.ID{ContainerID: "c", IfName: "eth0", Network: "n"}
	ps := plan(c, a, v4, v6)
	if len(ps) != 2 || ps[0].Family != ruleset.V4 || ps[1].Family != ruleset.V6 {
		t.Fatalf("plans %+v", ps)
	}
	// v4: 2 mappings x (hairpin, localhost, dnat); v6: 2 mappings x (hairpin, dnat)
	if len(ps[0].Rules) != 6 || len(ps[1].Rules) != 4 {
		t.Fatalf("rule counts %d %d", len(ps[0].Rules), len(ps[1].Rules))
	}
	if got := planSigs(ps[1]); strings.Join(got, " ") != "tcp/30080@*->[fd50:48::5]:80 tcp/30082@*->[fd50:48::5]:82" {
		t.Fatalf("v6 sigs %v (unspecified hostIP means any address)", got)
	}
	if ps := plan(c, a, nil, nil); len(ps) != 0 {
		t.Fatal("no addresses, yet a plan")
	}
	if got := udpPorts(c.Mappings, ruleset.V4); len(got) != 1 || got[0] != 30081 {
		t.Fatalf("udp ports v4 %v", got)
	}
	if got := udpPorts(c.Mappings, ruleset.V6); len(got) != 0 {
		t.Fatalf("udp ports v6 %v", got)
	}
	c.SNAT = false
	if ps := plan(c, a, v4, nil); len(ps[0].Rules) != 2 || ps[0].MarkBit != -1 {
		t.Fatalf("snat off: %+v", ps[0])
	}
}

func TestNeedsLocalnet(t *testing.T) {
	for keys, want := range map[string]bool{
		`"runtimeConfig":{"portMappings":[{"hostPort":1,"containerPort":1}]}`:                        true,
		`"snat":false,"runtimeConfig":{"portMappings":[{"hostPort":1,"containerPort":1}]}`:           false,
		`"runtimeConfig":{"portMappings":[{"hostPort":1,"containerPort":1,"hostIP":"198.18.48.1"}]}`: false,
		`"runtimeConfig":{"portMappings":[{"hostPort":1,"containerPort":1,"hostIP":"127.0.0.1"}]}`:   true,
		`"runtimeConfig":{"portMappings":[{"hostPort":1,"containerPort":1,"hostIP":"0.0.0.0"}]}`:     true,
		`"runtimeConfig":{"portMappings":[{"hostPort":1,"containerPort":1,"hostIP":"fd50:48::1"}]}`:  false,
	} {
		c, err := parseConfig(conf(keys))
		if err != nil {
			t.Fatal(err)
		}
		if got := needsLocalnet(c); got != want {
			t.Errorf("%s: %v, want %v", keys, got, want)
		}
	}
}

func TestKeyAndTag(t *testing.T) {
	a := attachment.ID{ContainerID: "c1", IfName: "eth0", Network: "n1"}
	b := attachment.ID{ContainerID: "c1", IfName: "eth0", Network: "renamed"}
	if a.PortmapKey() != b.PortmapKey() {
		t.Fatal("the key depends on the network name: a renamed network would leak")
	}
	if a.PortmapKey() == (attachment.ID{ContainerID: "c1", IfName: "eth1"}).PortmapKey() || len(a.PortmapKey()) != 16 {
		t.Fatal("key must differ per interface and be 16 hex digits")
	}
	if got := tagNetwork(tag(a, 255)); got != "n1" {
		t.Fatalf("tag network %q", got)
	}
	odd := attachment.ID{ContainerID: strings.Repeat("x", 300), IfName: "eth0", Network: `we"ird name`}
	tag := tag(odd, nftCommentMax)
	if len(tag) > nftCommentMax || strings.Contains(tag, `"`) || tagNetwork(tag) != attachment.NetworkTag(odd.Network) {
		t.Fatalf("tag %q", tag)
	}
	if tagNetwork("something else") != "" {
		t.Fatal("foreign comment read as a tag")
	}
}

func TestGCStale(t *testing.T) {
	tags := map[string]string{
		"k1": "meshwire-portmap net=n1 if=eth0 id=a",
		"k2": "meshwire-portmap net=n1 if=eth0 id=b",
		"k3": "meshwire-portmap net=other if=eth0 id=c",
		"k4": "",
	}
	got := gcStale([]string{"k1", "k2", "k3", "k4"}, func(k string) string { return tags[k] }, "n1", map[string]bool{"k1": true})
	if strings.Join(got, ",") != "k2" {
		t.Fatalf("stale %v, want only k2 (k1 valid, k3 another network, k4 untagged)", got)
	}
}
