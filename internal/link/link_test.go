package link

import (
	"github.com/vishvananda/netlink"

	"strings"
	"testing"
)

func TestHostVethName(t *testing.T) {
	id := strings.Repeat("a", 64)
	a := HostVethName("veth", id, "eth0")
	if a != HostVethName("veth", id, "eth0") {
		t.Fatal("not deterministic")
	}
	if len(a) != IFNameSize || !strings.HasPrefix(a, "veth") {
		t.Fatalf("%q: want 15 bytes starting with veth", a)
	}
	if a == HostVethName("veth", id, "eth1") || a == HostVethName("veth", strings.Repeat("b", 64), "eth0") {
		t.Fatal("different attachments share a name")
	}
	if got := HostVethName("", id, "eth0"); got != a {
		t.Fatalf("empty prefix gives %q, want the default %q", got, a)
	}
	if got := HostVethName("mwtb", id, "eth0"); len(got) != IFNameSize || !strings.HasPrefix(got, "mwtb") {
		t.Fatalf("%q", got)
	}
	if got := HostVethName("abcdefghijk", id, "eth0"); len(got) != IFNameSize {
		t.Fatalf("%q: longest prefix must still fit", got)
	}
}

func TestValidNames(t *testing.T) {
	for _, ok := range []string{"eth0", "net1", "a", "fifteen-chars-x"} {
		if err := ValidIfName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "sixteen-chars-xx", "a/b", "a b", "a:b", "é"} {
		if ValidIfName(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if ValidPrefix("twelve-chars") == nil || ValidPrefix("a/b") == nil {
		t.Error("bad prefix accepted")
	}
	if ValidPrefix("veth") != nil {
		t.Error("veth refused")
	}
}

func TestIsHostEnd(t *testing.T) {
	veth := func(idx, parent int) netlink.Link {
		return &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: idx, ParentIndex: parent}}
	}
	cases := []struct {
		name string
		l    netlink.Link
		want bool
	}{
		{"the peer", veth(17, 2), true},
		{"same index, other pair", veth(17, 5), false},
		{"other index", veth(18, 2), false},
		{"not a veth", &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Index: 17, ParentIndex: 2}}, false},
	}
	for _, c := range cases {
		if got := IsHostEnd(c.l, 2, 17); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}
