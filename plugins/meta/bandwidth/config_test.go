package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
)

const head = `"cniVersion":"1.0.0","name":"n","type":"bandwidth"`

func TestParseConfig(t *testing.T) {
	cases := []struct {
		name    string
		json    string
		want    Bandwidth
		code    uint
		mention string
	}{
		{name: "nothing", json: `{` + head + `}`},
		{name: "plugin config", json: `{` + head + `,"ingressRate":1000,"ingressBurst":2000,"egressRate":3000,"egressBurst":4000}`,
			want: Bandwidth{Ingress: Limit{1000, 2000}, Egress: Limit{3000, 4000}}},
		{name: "runtime config wins as a whole", json: `{` + head + `,"ingressRate":1000,"ingressBurst":2000,"egressRate":3000,"egressBurst":4000,"runtimeConfig":{"bandwidth":{"ingressRate":50,"ingressBurst":60}}}`,
			want: Bandwidth{Ingress: Limit{50, 60}, Source: "runtimeConfig.bandwidth"}},
		{name: "containerd form", json: `{` + head + `,"runtimeConfig":{"bandwidth":{"IngressRate":10000000,"IngressBurst":4294967295,"EgressRate":0,"EgressBurst":0}}}`,
			want: Bandwidth{Ingress: Limit{10000000, 4294967295}, Source: "runtimeConfig.bandwidth"}},
		{name: "null runtime bandwidth", json: `{` + head + `,"egressRate":8,"egressBurst":8,"runtimeConfig":{"bandwidth":null}}`,
			want: Bandwidth{Egress: Limit{8, 8}}},
		{name: "zeros are unshaped", json: `{` + head + `,"ingressRate":0,"ingressBurst":0}`},
		{name: "exponent form", json: `{` + head + `,"ingressRate":1e6,"ingressBurst":1.5e4}`, want: Bandwidth{Ingress: Limit{1000000, 15000}}},
		{name: "quoted number", json: `{` + head + `,"ingressRate":"1000","ingressBurst":"2000"}`, want: Bandwidth{Ingress: Limit{1000, 2000}}},
		{name: "largest burst", json: `{` + head + `,"ingressRate":8,"ingressBurst":34359738359}`, want: Bandwidth{Ingress: Limit{8, 34359738359}}},

		{name: "rate without burst", json: `{` + head + `,"ingressRate":1000}`, code: 7, mention: "ingressBurst"},
		{name: "burst without rate", json: `{` + head + `,"egressBurst":1000}`, code: 7, mention: "egressRate"},
		{name: "zero rate", json: `{` + head + `,"egressRate":0,"egressBurst":1000}`, code: 7, mention: "egressRate"},
		{name: "zero burst", json: `{` + head + `,"egressRate":1000,"egressBurst":0}`, code: 7, mention: "egressBurst"},
		{name: "negative", json: `{` + head + `,"ingressRate":-1,"ingressBurst":1000}`, code: 7, mention: "ingressRate"},
		{name: "negative exponent", json: `{` + head + `,"ingressRate":1000,"ingressBurst":-1e3}`, code: 7, mention: "ingressBurst"},
		{name: "fraction", json: `{` + head + `,"ingressRate":1000.5,"ingressBurst":1000}`, code: 7, mention: "ingressRate"},
		{name: "beyond uint64", json: `{` + head + `,"ingressRate":1e30,"ingressBurst":1000}`, code: 7, mention: "ingressRate"},
		{name: "rate below 8", json: `{` + head + `,"ingressRate":7,"ingressBurst":1000}`, code: 7, mention: "ingressRate"},
		{name: "burst below a byte", json: `{` + head + `,"ingressRate":1000,"ingressBurst":7}`, code: 7, mention: "ingressBurst"},
		{name: "burst of 4 GiB", json: `{` + head + `,"ingressRate":1000,"ingressBurst":34359738360}`, code: 7, mention: "ingressBurst"},
		{name: "string not a number", json: `{` + head + `,"egressRate":"fast","egressBurst":1}`, code: 7, mention: "egressRate"},
		{name: "infinity", json: `{` + head + `,"egressRate":"Inf","egressBurst":1}`, code: 7, mention: "egressRate"},
		{name: "object", json: `{` + head + `,"runtimeConfig":{"bandwidth":{"ingressRate":{},"ingressBurst":1}}}`, code: 7, mention: "runtimeConfig.bandwidth.ingressRate"},
		{name: "wrong type", json: `{` + head + `,"egressRate":[1],"egressBurst":1}`, code: 7, mention: "egressRate"},
		{name: "runtime field named", json: `{` + head + `,"runtimeConfig":{"bandwidth":{"egressRate":1000}}}`, code: 7, mention: "runtimeConfig.bandwidth.egressBurst"},
		{name: "plugin config ignored when runtime given", json: `{` + head + `,"ingressRate":1000,"runtimeConfig":{"bandwidth":{}}}`, want: Bandwidth{Source: "runtimeConfig.bandwidth"}},
		{name: "not json", json: `{"cniVersion":`, code: 6},
		{name: "wrong plugin", json: `{"cniVersion":"1.0.0","name":"n","type":"ptp"}`, code: 7, mention: "type"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, bw, err := parseConfig([]byte(c.json))
			if c.code != 0 {
				if err == nil || cnierr.Code(err) != c.code || !strings.Contains(err.Error(), c.mention) {
					t.Fatalf("got %v, want code %d naming %q", err, c.code, c.mention)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if bw != c.want {
				t.Fatalf("got %+v, want %+v", bw, c.want)
			}
		})
	}
}

func TestTbfFor(t *testing.T) {
	const tick = 15.625 // psched ticks per µs on current kernels
	const frames = queueFrames * 1514
	cases := []struct {
		name       string
		l          Limit
		mtu        int
		rate       uint64
		bucket     uint64
		limit      uint32
		bufferTick uint32
	}{
		// 10 Mbit/s, 100 kbit burst: 12500-byte bucket = 10 ms.
		{"plain", Limit{10_000_000, 100_000}, 1500, 1_250_000, 12_500, 6250 + frames, 156250},
		// A burst smaller than a frame is raised to one frame.
		{"tiny burst", Limit{8_000_000, 800}, 1500, 1_000_000, 1514, 5000 + frames, 23656},
		{"jumbo", Limit{8_000_000, 800}, 9000, 1_000_000, 9014, 5000 + queueFrames*9014, 140843},
		// containerd's 2^32-1 bits at 10 Mbit/s is 429 s of traffic: cut to the kernel's 4.29 s.
		{"containerd burst", Limit{10_000_000, 1<<32 - 1}, 1500, 1_250_000, 5_368_708, 6250 + maxGSOPacket, 67108859},
		{"1 Gbit/s", Limit{1_000_000_000, 20_000_000}, 1500, 125_000_000, 2_500_000, 625_000 + maxGSOPacket, 20000 * 15625 / 1000},
		// A bucket between 16 frames and a GSO packet: room for one packet of the bucket's size.
		{"mid bucket", Limit{10_000_000, 320_000}, 1500, 1_250_000, 40_000, 6250 + 40_000, 500000},
		// Queue limit saturates at the kernel's 32 bits.
		{"huge rate", Limit{1 << 50, 1 << 20}, 1500, 1 << 47, 1 << 17, ^uint32(0), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := tbfFor(c.l, c.mtu, tick)
			if p.Rate != c.rate || p.Bucket != c.bucket || p.Limit != c.limit || (c.bufferTick != 0 && p.Buffer != c.bufferTick) {
				t.Fatalf("got %+v, want rate %d bucket %d limit %d buffer %d", p, c.rate, c.bucket, c.limit, c.bufferTick)
			}
			if uint64(p.Buffer)<<6 > uint64(^uint32(0)) {
				t.Fatalf("buffer %d ticks is more than the kernel keeps", p.Buffer)
			}
		})
	}
}

func TestIfbName(t *testing.T) {
	id := attachment.ID{Network: "net", ContainerID: "c1", IfName: "eth0"}
	a := id.Ifb()
	if len(a) != 15 || !strings.HasPrefix(a, "mwbw") {
		t.Fatalf("%q: want 15 bytes starting mwbw", a)
	}
	for _, other := range []attachment.ID{{Network: "net", ContainerID: "c2", IfName: "eth0"}, {Network: "net", ContainerID: "c1", IfName: "eth1"}, {Network: "net", ContainerID: "c", IfName: "1eth0"}} {
		if other.Ifb() == a {
			t.Fatalf("%q is shared by two attachments", a)
		}
	}
	// The network is in the alias, not in the name; DEL, CHECK and GC also
	// look for the older name, which held it.
	if names := id.IfbNames(); len(names) != 2 || names[0] != a || names[1] != attachment.LegacyIfb("net", "c1", "eth0") {
		t.Fatalf("IfbNames = %q", names)
	}
}

func TestAlias(t *testing.T) {
	in := ifbInfo{Net: attachment.NetworkTag("n"), Dev: 42, OwnsIngress: true, ContainerID: "abc", IfName: "eth0"}
	out, ok := parseAlias(in.alias())
	if !ok || out != in {
		t.Fatalf("round trip: %+v -> %q -> %+v %v", in, in.alias(), out, ok)
	}
	long := ifbInfo{Net: "x", ContainerID: strings.Repeat("a", 400)}
	if len(long.alias()) > 255 {
		t.Fatal("alias longer than the kernel keeps")
	}
	for _, s := range []string{"", "something else", "meshwire-bandwidth dev=1", "meshwire-bandwidth net=x dev=nope"} {
		if _, ok := parseAlias(s); ok {
			t.Fatalf("%q parsed as meshwire's", s)
		}
	}
}

func TestGCVictims(t *testing.T) {
	mine := func(net, id string) (string, string) {
		return attachment.ID{Network: net, ContainerID: id, IfName: "eth0"}.Ifb(), ifbInfo{Net: attachment.NetworkTag(net), ContainerID: id, IfName: "eth0"}.alias()
	}
	// As meshwire named and tagged them before package attachment.
	old := func(net, id string) (string, string) {
		return attachment.LegacyIfb(net, id, "eth0"), ifbInfo{Net: attachment.LegacyBandwidthNetworkTag(net), ContainerID: id, IfName: "eth0"}.alias()
	}
	devs := map[string]string{}
	for _, x := range []struct{ net, id string }{{"a", "keep"}, {"a", "stale"}, {"b", "other"}} {
		n, al := mine(x.net, x.id)
		devs[n] = al
	}
	for _, x := range []struct{ net, id string }{{"a", "keepold"}, {"a", "staleold"}, {"b", "otherold"}} {
		n, al := old(x.net, x.id)
		devs[n] = al
	}
	devs["mwbwforeign0000"] = "not ours"
	devs["ifb0"] = ""
	valid := func(ids ...string) []attachment.ID {
		var out []attachment.ID
		for _, id := range ids {
			out = append(out, attachment.ID{ContainerID: id, IfName: "eth0"})
		}
		return out
	}
	got := gcVictims("a", devs, valid("keep", "keepold", "gone"))
	slices.Sort(got)
	stale, _ := mine("a", "stale")
	staleOld, _ := old("a", "staleold")
	want := []string{stale, staleOld}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("GC victims %v, want exactly %v", got, want)
	}
	if got := gcVictims("a", devs, valid("keep", "stale", "keepold", "staleold")); len(got) != 0 {
		t.Fatalf("everything valid, yet GC removes %v", got)
	}
}
