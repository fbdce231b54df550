package link

import (
	"github.com/vishvananda/netlink"

	"testing"
)

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
