package ipmasq

import (
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from %s:\n--- got\n%s--- want\n%s", name, p, got, want)
	}
}

func cidr(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return *n
}

var att = Attachment{Network: "mwtb-net", ContainerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", IfName: "eth0"}

func TestRenderGolden(t *testing.T) {
	v4 := []net.IPNet{cidr("198.18.16.5/24")}
	v6 := []net.IPNet{cidr("fd20:0:0:16::5/64")}
	golden(t, "iptables-add-v4", IPTablesAdd(att, v4))
	golden(t, "iptables-add-v6", IPTablesAdd(att, v6))
	golden(t, "iptables-del-guess-v4", IPTablesDelGuess(att, v4))
	golden(t, "nft-add-dual", NftAdd(att, append(v4, v6...)))
}

// TestIPTablesDelFromSave: the removal found in a saved ruleset names
// exactly the attachment's rules, and nothing of another attachment or of
// other software.
func TestIPTablesDelFromSave(t *testing.T) {
	other := Attachment{Network: "mwtb-net", ContainerID: "ffff", IfName: "eth0"}
	body := func(p string) string { return strings.TrimSuffix(strings.TrimPrefix(p, "*nat\n"), "COMMIT\n") }
	save := "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:CNI-abc - [0:0]\n" +
		body(IPTablesAdd(att, []net.IPNet{cidr("198.18.16.5/24"), cidr("198.18.17.5/24")})) +
		body(IPTablesAdd(other, []net.IPNet{cidr("198.18.16.6/24")})) +
		"-A POSTROUTING -s 10.0.0.0/8 -m comment --comment \"meshwire-masqx\" -j CNI-abc\nCOMMIT\n"
	got := IPTablesDel(save, map[string]bool{att.Chain(): true})
	golden(t, "iptables-del-from-save", got)
	if strings.Contains(got, other.Chain()) || strings.Contains(got, "CNI-abc") {
		t.Fatalf("removal touches what is not the attachment's:\n%s", got)
	}
	if strings.Count(got, "-D ") != 2 {
		t.Fatalf("removal must name both addresses' rules:\n%s", got)
	}
	if IPTablesDel(save, map[string]bool{"MW-00000000-000000000000000": true}) != "" {
		t.Fatal("removal of an absent attachment is not empty")
	}
	if tags := IPTablesTags(save, "mwtb-net"); len(tags) != 2 {
		t.Fatalf("tags of the network: %v, want 2", tags)
	}
	if len(IPTablesTags(save, "another-net")) != 0 {
		t.Fatal("tags of another network found")
	}
	// The guessed removal is the saved rules with -D: what ADD wrote.
	if g := IPTablesDelGuess(att, []net.IPNet{cidr("198.18.16.5/24"), cidr("198.18.17.5/24")}); g != got {
		t.Fatalf("guess\n%s\ndiffers from the removal found in the ruleset\n%s", g, got)
	}
}

// TestCommentTag: the tag read back from a rule's comment is the
// attachment's, and other comments have none.
func TestCommentTag(t *testing.T) {
	if got := commentTag(att.comment()); got != att.Chain() {
		t.Fatalf("tag of %q = %q, want %q", att.comment(), got, att.Chain())
	}
	for _, c := range []string{"", "meshwire-masqx", "kube masquerade", "meshwire-portmap " + att.Chain()} {
		if got := commentTag(c); got != "" {
			t.Fatalf("tag of %q = %q, want none", c, got)
		}
	}
}

func TestNames(t *testing.T) {
	if n := len(att.Chain()); n != 27 {
		t.Fatalf("tag %q is %d bytes", att.Chain(), n)
	}
	if att.Chain() == (Attachment{Network: "other", ContainerID: att.ContainerID, IfName: "eth0"}).Chain() {
		t.Fatal("two networks share a chain name")
	}
	if att.Chain() == (Attachment{Network: att.Network, ContainerID: att.ContainerID, IfName: "eth1"}).Chain() {
		t.Fatal("two interfaces share a chain name")
	}
	if c := att.comment(); len(c) > 127 {
		t.Fatalf("comment %q longer than nftables allows", c)
	}
	long := Attachment{Network: strings.Repeat("n", 200), ContainerID: strings.Repeat("c", 200), IfName: "eth0\"x"}
	if c := long.comment(); len(c) > 127 || strings.Contains(c, `"`) {
		t.Fatalf("comment %q is too long or holds a quote", c)
	}
}
