package ipmasq

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwfake"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/golden"
	"github.com/meshwire/meshwire/internal/ruleset"
)

func cidr(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return *n
}

var att = attachment.ID{Network: "mwtb-net", ContainerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", IfName: "eth0"}

func TestRenderGolden(t *testing.T) {
	v4 := []net.IPNet{cidr("198.18.16.5/24")}
	v6 := []net.IPNet{cidr("fd20:0:0:16::5/64")}
	golden.Check(t, "iptables-add-v4", fwtext.Text(AddTx(att, v4), false))
	golden.Check(t, "iptables-add-v6", fwtext.Text(AddTx(att, v6), false))
	golden.Check(t, "iptables-del-guess-v4", fwtext.Text(DelGuessTx(att, v4), false))
	golden.Check(t, "nft-add-dual", NftAdd(att, append(v4, v6...)))
}

// TestIPTablesDelFromSave: on legacy iptables, a Teardown that does not
// know the addresses reads the chain and removes exactly the attachment's
// rules, and nothing of another attachment or of other software, in one
// transaction (the golden payload); the guessed removal is the same.
func TestIPTablesDelFromSave(t *testing.T) {
	ctx := context.Background()
	other := attachment.ID{Network: "mwtb-net", ContainerID: "ffff", IfName: "eth0"}
	addrs := []net.IPNet{cidr("198.18.16.5/24"), cidr("198.18.17.5/24")}
	fw := fwfake.New(firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantLegacy})
	nat := ruleset.TableID{Family: ruleset.IP, Name: "nat"}
	must(t, fw.Apply(ctx, (&ruleset.Tx{}).AddChain(nat, ruleset.Chain{Name: "CNI-abc"})))
	must(t, Setup(ctx, fw, att, addrs))
	must(t, Setup(ctx, fw, other, []net.IPNet{cidr("198.18.16.6/24")}))
	must(t, fw.Apply(ctx, (&ruleset.Tx{}).AddRule(nat, ruleset.Rule{Chain: "POSTROUTING",
		Match: []ruleset.Match{{Kind: ruleset.MatchSrc, Prefix: netip.MustParsePrefix("10.0.0.0/8")}}, Comment: "meshwire-masqx",
		Target: ruleset.Target{Kind: ruleset.Jump, Chain: "CNI-abc"}})))
	must(t, Teardown(ctx, fw, att, nil))
	log := fw.Log()
	got := fwtext.Text(log[len(log)-1].Tx, false)
	golden.Check(t, "iptables-del-from-save", got)
	if strings.Count(got, "-D ") != 2 {
		t.Fatalf("removal must name both addresses' rules:\n%s", got)
	}
	if g := fwtext.Text(DelGuessTx(att, addrs), false); g != got {
		t.Fatalf("guess\n%s\ndiffers from the removal found in the ruleset\n%s", g, got)
	}
	post := fw.Table(ruleset.IP, "nat").Chain("POSTROUTING")
	if len(post.Rules) != 2 || commentTag(post.Rules[0].Comment) != other.MasqTag() || post.Rules[1].Jump != "CNI-abc" {
		t.Fatalf("Teardown touched what is not the attachment's:\n%s", fw.Dump())
	}
	n := len(fw.Ops())
	must(t, Teardown(ctx, fw, att, nil))
	if len(fw.Ops()) != n {
		t.Fatalf("a second Teardown wrote: %v", fw.Ops()[n:])
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestCommentTag: the tag read back from a rule's comment is the
// attachment's, and other comments have none.
func TestCommentTag(t *testing.T) {
	if got := commentTag(comment(att)); got != att.MasqTag() {
		t.Fatalf("tag of %q = %q, want %q", comment(att), got, att.MasqTag())
	}
	for _, c := range []string{"", "meshwire-masqx", "kube masquerade", "meshwire-portmap " + att.MasqTag()} {
		if got := commentTag(c); got != "" {
			t.Fatalf("tag of %q = %q, want none", c, got)
		}
	}
}

func TestNames(t *testing.T) {
	if n := len(att.MasqTag()); n != 27 {
		t.Fatalf("tag %q is %d bytes", att.MasqTag(), n)
	}
	if att.MasqTag() == (attachment.ID{Network: "other", ContainerID: att.ContainerID, IfName: "eth0"}).MasqTag() {
		t.Fatal("two networks share a tag")
	}
	if att.MasqTag() == (attachment.ID{Network: att.Network, ContainerID: att.ContainerID, IfName: "eth1"}).MasqTag() {
		t.Fatal("two interfaces share a tag")
	}
	if c := comment(att); len(c) > 127 {
		t.Fatalf("comment %q longer than nftables allows", c)
	}
	long := attachment.ID{Network: strings.Repeat("n", 200), ContainerID: strings.Repeat("c", 200), IfName: "eth0\"x"}
	if c := comment(long); len(c) > 127 || strings.Contains(c, `"`) {
		t.Fatalf("comment %q is too long or holds a quote", c)
	}
}
