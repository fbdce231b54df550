package refrules

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// The fixtures are what the reference plugins left on a host for two
// containers ctrA and ctrB of network refnet (bridge with ipMasq and
// host-local, dual stack, then portmap with one mapping each), read with
// iptables-save -t nat of both families and nft list ruleset:
// v1.9.1-iptables.txt (iptables-legacy), 1.1.1-iptables.txt (Debian's
// 1.1.1 on iptables-nft; the same rules) and v1.9.1-nftables.txt
// (ipMasqBackend and backend nftables).
const network = "refnet"

var (
	refA = attachment.Reference{Network: network, ContainerID: "ctrA", IfName: "eth0"}
	refB = attachment.Reference{Network: network, ContainerID: "ctrB", IfName: "eth0"}
)

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fakeNode is a node whose legacy and nf_tables firewalls are fakes.
type fakeNode struct {
	*node
	legacy, nft *fwfake.Fake
}

func newFakeNode() *fakeNode {
	legacy := fwfake.New(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantLegacy})
	nft := fwfake.New(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT})
	n := &node{legacy: legacy, nft: nft}
	return &fakeNode{node: n, legacy: legacy, nft: nft}
}

// loadIPTables loads an iptables fixture (iptables-save output of both
// families) into fw, as the firewall's own reads parse it.
func loadIPTables(t *testing.T, fw *fwfake.Fake, save string) {
	t.Helper()
	_, v6, _ := strings.Cut(save, "# ip6tables\n")
	v4 := strings.TrimPrefix(strings.Split(save, "# ip6tables\n")[0], "# iptables\n")
	for f, p := range map[ruleset.IPVersion]string{ruleset.V4: v4, ruleset.V6: v6} {
		tables := fwtext.ParseIPTablesSave(f, "", p)
		if len(tables) == 0 {
			t.Fatalf("fixture IPv%d holds no table", f)
		}
		fw.Load(tables...)
	}
}

// refNftables is v1.9.1-nftables.txt (what the reference's ipMasq and
// portmap wrote with backend nftables) as typed tables, applied to fw.
func refNftables(t *testing.T, fw *fwfake.Fake) {
	t.Helper()
	p := netip.MustParsePrefix
	src := func(a string) ruleset.Match { return ruleset.Match{Kind: ruleset.MatchSrc, Prefix: p(a), Host: true} }
	dst := func(a string, not bool) ruleset.Match {
		return ruleset.Match{Kind: ruleset.MatchDst, Prefix: p(a), Not: not, Host: true}
	}
	masq := ruleset.Target{Kind: ruleset.Masquerade}
	ret := ruleset.Target{Kind: ruleset.Return}
	masqComment := func(r attachment.Reference) string {
		return r.MasqNftKey() + ", net: refnet, if: eth0, id: " + r.ContainerID
	}
	tx := (&ruleset.Tx{}).AddTable(ruleset.Table{Family: ruleset.Inet, Name: "cni_plugins_masquerade",
		Comment: "Masquerading for plugins from github.com/containernetworking/plugins",
		Chains: []ruleset.Chain{
			{Name: "masq_checks", Comment: "Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet", Rules: []ruleset.Rule{
				{Match: []ruleset.Match{src("198.18.0.2/32"), dst("198.18.0.0/24", true)}, Target: masq, Comment: masqComment(refA)},
				{Match: []ruleset.Match{src("fd00:18::2/128"), dst("fd00:18::/64", true)}, Target: masq, Comment: masqComment(refA)},
				{Match: []ruleset.Match{src("198.18.0.3/32"), dst("198.18.0.0/24", true)}, Target: masq, Comment: masqComment(refB)},
				{Match: []ruleset.Match{src("fd00:18::3/128"), dst("fd00:18::/64", true)}, Target: masq, Comment: masqComment(refB)},
			}},
			{Name: "postrouting", Base: &ruleset.BaseChain{Type: "nat", Hook: "postrouting", Priority: 100, PriorityName: "srcnat"}, Rules: []ruleset.Rule{
				{Match: []ruleset.Match{dst("224.0.0.0/4", false)}, Target: ret},
				{Match: []ruleset.Match{dst("ff00::/8", false)}, Target: ret},
				{Target: ruleset.Target{Kind: ruleset.Jump, Chain: "masq_checks"}}, // goto in the fixture
			}},
		}})
	for _, fam := range []ruleset.Family{ruleset.IP, ruleset.IP6} {
		addr := map[ruleset.Family][2]string{ruleset.IP: {"198.18.0.2", "198.18.0.3"}, ruleset.IP6: {"fd00:18::2", "fd00:18::3"}}[fam]
		bits := map[ruleset.Family]int{ruleset.IP: 32, ruleset.IP6: 128}[fam]
		dport := func(port uint16) ruleset.Match {
			return ruleset.Match{Kind: ruleset.MatchDPort, Name: "tcp", Ports: []uint16{port}}
		}
		dnat := func(a string) ruleset.Target {
			return ruleset.Target{Kind: ruleset.DNAT, To: netip.AddrPortFrom(netip.MustParseAddr(a), 80)}
		}
		host := func(a string) string { return fmt.Sprintf("%s/%d", a, bits) }
		masquerading := []ruleset.Rule{
			{Match: []ruleset.Match{src(host(addr[0])), dst(host(addr[0]), false)}, Target: masq, Comment: "ctrA"},
			{Match: []ruleset.Match{src(host(addr[1])), dst(host(addr[1]), false)}, Target: masq, Comment: "ctrB"},
		}
		if fam == ruleset.IP {
			masquerading = []ruleset.Rule{masquerading[0],
				{Match: []ruleset.Match{src("127.0.0.1/32"), dst(host(addr[0]), false)}, Target: masq, Comment: "ctrA"},
				masquerading[1],
				{Match: []ruleset.Match{src("127.0.0.1/32"), dst(host(addr[1]), false)}, Target: masq, Comment: "ctrB"},
			}
		}
		local := []ruleset.Match{{Kind: ruleset.MatchDstType, Name: "LOCAL"}}
		all := ruleset.Target{Kind: ruleset.Jump, Chain: "hostports_all"}
		tx.AddTable(ruleset.Table{Family: fam, Name: "cni_hostport", Comment: "CNI portmap plugin", Chains: []ruleset.Chain{
			{Name: "hostports", Rules: []ruleset.Rule{
				{Match: []ruleset.Match{dport(8081)}, Target: dnat(addr[0]), Comment: "ctrA"},
				{Match: []ruleset.Match{dport(8082)}, Target: dnat(addr[1]), Comment: "ctrB"},
			}},
			{Name: "hostip_hostports"},
			{Name: "hostports_all", Rules: []ruleset.Rule{
				{Target: ruleset.Target{Kind: ruleset.Jump, Chain: "hostip_hostports"}},
				{Target: ruleset.Target{Kind: ruleset.Jump, Chain: "hostports"}},
			}},
			{Name: "prerouting", Base: &ruleset.BaseChain{Type: "nat", Hook: "prerouting", Priority: -100, PriorityName: "dstnat"},
				Rules: []ruleset.Rule{{Match: local, Target: all}}},
			{Name: "output", Base: &ruleset.BaseChain{Type: "nat", Hook: "output", Priority: -100},
				Rules: []ruleset.Rule{{Match: local, Target: all}}},
			{Name: "masquerading", Base: &ruleset.BaseChain{Type: "nat", Hook: "postrouting", Priority: 100, PriorityName: "srcnat"},
				Rules: masquerading},
		}})
	}
	if err := fw.Apply(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
}

func (n *fakeNode) dump() string { return n.legacy.Dump() + n.nft.Dump() }

// wantGone fails unless nothing of the references in gone is in the
// dump, and something of each in kept is.
func wantGone(t *testing.T, dump string, gone []attachment.Reference, kept []attachment.Reference) {
	t.Helper()
	for _, r := range gone {
		for _, k := range []string{r.MasqChain(), r.PortmapDNATChain(), r.MasqNftKey(), `"` + r.ContainerID + `"`} {
			if strings.Contains(dump, k) {
				t.Fatalf("%s's %q remains:\n%s", r.ContainerID, k, dump)
			}
		}
	}
	for _, r := range kept {
		if !strings.Contains(dump, r.ContainerID) {
			t.Fatalf("%s's rules are gone:\n%s", r.ContainerID, dump)
		}
	}
}

// forms are the fixtures as each form of the firewall holds them.
var forms = []struct {
	name string
	load func(t *testing.T, n *fakeNode)
}{
	{"v1.9.1 iptables-legacy", func(t *testing.T, n *fakeNode) { loadIPTables(t, n.legacy, fixture(t, "v1.9.1-iptables.txt")) }},
	{"1.1.1 iptables-nft", func(t *testing.T, n *fakeNode) { loadIPTables(t, n.nft, fixture(t, "1.1.1-iptables.txt")) }},
	{"v1.9.1 nftables", func(t *testing.T, n *fakeNode) { refNftables(t, n.nft) }},
}

func (n *fakeNode) del(t *testing.T, r attachment.Reference) {
	t.Helper()
	if err := n.delMasq(context.Background(), r); err != nil {
		t.Fatalf("delMasq %s: %v", r.ContainerID, err)
	}
	if err := n.delPortmap(context.Background(), r); err != nil {
		t.Fatalf("delPortmap %s: %v", r.ContainerID, err)
	}
}

func (n *fakeNode) gc(t *testing.T, network string, valid ...attachment.Reference) {
	t.Helper()
	var v []types.GCAttachment
	for _, r := range valid {
		v = append(v, types.GCAttachment{ContainerID: r.ContainerID, IfName: r.IfName})
	}
	if err := n.gcMasq(context.Background(), network, v); err != nil {
		t.Fatalf("gcMasq: %v", err)
	}
	if err := n.gcPortmap(context.Background(), network, v); err != nil {
		t.Fatalf("gcPortmap: %v", err)
	}
}

func (n *fakeNode) ops() int { return len(n.legacy.Ops()) + len(n.nft.Ops()) }

// wantEmpty fails unless nothing of the reference's is left: the nat
// tables hold their built-in chains only, no reference table exists.
func (n *fakeNode) wantEmpty(t *testing.T) {
	t.Helper()
	for _, fw := range []*fwfake.Fake{n.legacy, n.nft} {
		for _, fam := range []ruleset.Family{ruleset.IP, ruleset.IP6} {
			if tb := fw.Table(fam, "nat"); tb != nil {
				for _, c := range tb.Chains {
					if c.Hook == "" || len(c.Rules) > 0 {
						t.Fatalf("%s: nat keeps chain %s (%d rules):\n%s", fw.Backend(), c.Name, len(c.Rules), n.dump())
					}
				}
			}
		}
	}
	for _, fam := range []ruleset.Family{ruleset.IP, ruleset.IP6, ruleset.Inet} {
		if names, _ := n.nft.Tables(context.Background(), fam); len(names) > 0 {
			t.Fatalf("tables %v of %s remain:\n%s", names, fam.Name(), n.dump())
		}
	}
}

// TestDel: DEL of one attachment removes its objects in every form and
// leaves the other's; DEL of the last takes the shared objects too; a
// second DEL changes nothing.
func TestDel(t *testing.T) {
	for _, form := range forms {
		t.Run(form.name, func(t *testing.T) {
			n := newFakeNode()
			form.load(t, n)
			n.del(t, refA)
			wantGone(t, n.dump(), []attachment.Reference{refA}, []attachment.Reference{refB})
			if !strings.Contains(n.dump(), "CNI-HOSTPORT-DNAT") && !strings.Contains(n.dump(), "cni_hostport") {
				t.Fatalf("the shared portmap objects went with another attachment left:\n%s", n.dump())
			}
			n.del(t, refB)
			n.wantEmpty(t)
			ops := n.ops()
			n.del(t, refA)
			n.del(t, refB)
			if n.ops() != ops {
				t.Fatalf("a second DEL wrote: %v %v", n.legacy.Ops()[ops:], n.nft.Ops())
			}
		})
	}
}

// TestDelOtherNetwork: the iptables chains are per network and container,
// so a DEL of the same container on another network keeps them; the
// nftables portmap rules carry the container id alone, and go (as with
// the reference's DEL).
func TestDelOtherNetwork(t *testing.T) {
	for _, form := range forms[:2] {
		t.Run(form.name, func(t *testing.T) {
			n := newFakeNode()
			form.load(t, n)
			before := n.dump()
			n.del(t, attachment.Reference{Network: "other", ContainerID: "ctrA", IfName: "eth0"})
			if n.dump() != before || n.ops() != 0 {
				t.Fatalf("DEL on another network changed the ruleset (ops %v):\n%s", append(n.legacy.Ops(), n.nft.Ops()...), n.dump())
			}
		})
	}
}

// TestGC: GC keeps the valid attachment's objects and removes the
// others' of the network; with nothing valid, everything but the nftables
// portmap rules (which DEL removes) goes. GC of another network touches
// nothing.
func TestGC(t *testing.T) {
	for _, form := range forms {
		t.Run(form.name, func(t *testing.T) {
			n := newFakeNode()
			form.load(t, n)
			before := n.dump()
			n.gc(t, "other")
			if n.dump() != before {
				t.Fatalf("GC of another network changed the ruleset:\n%s", n.dump())
			}
			n.gc(t, network, refB)
			nftables := strings.Contains(form.name, "nftables")
			if !nftables {
				wantGone(t, n.dump(), []attachment.Reference{refA}, []attachment.Reference{refB})
			} else if strings.Contains(n.dump(), refA.MasqNftKey()) || !strings.Contains(n.dump(), refB.MasqNftKey()) {
				t.Fatalf("GC of nftables ipMasq:\n%s", n.dump())
			}
			n.gc(t, network, attachment.Reference{Network: network, ContainerID: "nobody", IfName: "eth0"})
			if nftables {
				if strings.Contains(n.dump(), attachment.RefMasqTable) {
					t.Fatalf("GC left the ipMasq table:\n%s", n.dump())
				}
				n.del(t, refA)
				n.del(t, refB)
			}
			n.wantEmpty(t)
		})
	}
}

// TestGCValidInterface: the nftables ipMasq rules are per interface, as
// the reference's GC keys them: a valid list naming another interface of
// the container does not keep them.
func TestGCValidInterface(t *testing.T) {
	n := newFakeNode()
	forms[2].load(t, n)
	n.gc(t, network, refB, attachment.Reference{Network: network, ContainerID: "ctrA", IfName: "net1"})
	if strings.Contains(n.dump(), refA.MasqNftKey()) {
		t.Fatalf("GC kept ctrA/eth0:\n%s", n.dump())
	}
}

// TestNothingThere: on a node without the reference's objects, DEL and
// GC write nothing.
func TestNothingThere(t *testing.T) {
	n := newFakeNode()
	n.del(t, refA)
	n.gc(t, network)
	if n.ops() != 0 {
		t.Fatalf("wrote %v %v", n.legacy.Ops(), n.nft.Ops())
	}
}

// TestIDFromComment: the comments' container id, as the reference quotes
// it in each.
func TestIDFromComment(t *testing.T) {
	for _, c := range []struct {
		comment, prefix string
		unquote         func(string) (string, error)
		want            string
		ok              bool
	}{
		{refA.MasqComment(), `name: "refnet" id: `, strconvUnquote, "ctrA", true},
		{refA.PortmapDNATComment(), `dnat name: "refnet" id: `, plainUnquote, "ctrA", true},
		{`dnat name: "refnet" id: "ctr`, `dnat name: "refnet" id: `, plainUnquote, "", false},
		{`name: "refnet2" id: "ctrA"`, `name: "refnet" id: `, strconvUnquote, "", false},
		{`name: "refnet" id: ""`, `name: "refnet" id: `, strconvUnquote, "", false},
	} {
		got, ok := idFromComment(c.comment, c.prefix, c.unquote)
		if got != c.want || ok != c.ok {
			t.Errorf("idFromComment(%q) = %q, %v; want %q, %v", c.comment, got, ok, c.want, c.ok)
		}
	}
}

var strconvUnquote = strconv.Unquote
