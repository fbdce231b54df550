package firewall

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/meshwire/meshwire/internal/nftnl"
)

// TestEncodeMasqueradeRule: a typed masquerade rule is encoded as the
// expressions of its iptables-restore line (nftnl's tests check those
// against iptables-nft), and decodes back to itself.
func TestEncodeMasqueradeRule(t *testing.T) {
	for _, c := range []struct {
		fam      TableFamily
		src, dst string
		notSrc   bool
	}{
		{IP, "198.18.16.5/32", "198.18.16.0/24", false},
		{IP, "198.18.16.5/32", "198.18.16.4/30", false},
		{IP, "198.18.16.0/20", "198.18.0.0/16", true},
		{IP6, "fd20::5/128", "fd20::/64", false},
		{IP6, "fd20::5/128", "fd20:0:0:ab80::/57", false},
	} {
		r := Rule{
			Family: c.fam, Table: "nat", Chain: "POSTROUTING",
			Src: netip.MustParsePrefix(c.src), NotSrc: c.notSrc,
			Dst: netip.MustParsePrefix(c.dst), NotDst: true,
			NotDstMulticast: true, Comment: "meshwire-masq MW-x net=n", Target: "MASQUERADE",
		}
		nr, err := encodeRule(r)
		if err != nil {
			t.Fatal(err)
		}
		_, src, _ := net.ParseCIDR(c.src)
		_, dst, _ := net.ParseCIDR(c.dst)
		cm, _ := nftnl.Comment(r.Comment)
		f := c.fam
		want := append(nftnl.AddrMatch(f, false, c.notSrc, *src), nftnl.AddrMatch(f, true, true, *dst)...)
		want = append(want, nftnl.NotMulticastDst(), cm, nftnl.Counter(), nftnl.Masquerade(f))
		if nr.Family != f || nr.Table != "nat" || nr.Chain != "POSTROUTING" || !bytes.Equal(nftnl.EncodeExprs(nr.Exprs), nftnl.EncodeExprs(want)) {
			t.Errorf("%s %s: encoded otherwise than the line's expressions", c.src, c.dst)
		}
		if got := decodeAppended(nr); got != r {
			t.Errorf("decoded back as\n%+v\nwant\n%+v", got, r)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	base := Rule{Family: IP, Table: "nat", Chain: "POSTROUTING", Src: netip.MustParsePrefix("198.18.0.1/32"), Target: "MASQUERADE"}
	for name, r := range map[string]Rule{
		"inet table":    {Family: Inet, Table: "t", Chain: "c"},
		"port":          func() Rule { x := base; x.DPort = 80; return x }(),
		"other target":  func() Rule { x := base; x.Target = "DNAT"; return x }(),
		"jump":          func() Rule { x := base; x.Target, x.Jump = "", "X"; return x }(),
		"v6 in ip":      func() Rule { x := base; x.Src = netip.MustParsePrefix("fd20::1/128"); return x }(),
		"long comment":  func() Rule { x := base; x.Comment = string(make([]byte, 300)); return x }(),
		"4in6 address":  func() Rule { x := base; x.Src = netip.MustParsePrefix("::ffff:198.18.0.1/128"); return x }(),
		"interface in":  func() Rule { x := base; x.In = "eth0"; return x }(),
		"mark matching": func() Rule { x := base; x.HasMark = true; return x }(),
	} {
		if _, err := encodeRule(r); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
	if _, err := encodeRule(base); err != nil {
		t.Errorf("a plain rule: %v", err)
	}
}
