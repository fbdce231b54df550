package attachment

import "testing"

// TestReferenceNames pins the names against values printed by the
// reference v1.9.1's own code (pkg/utils.FormatChainName, FormatComment,
// MustFormatChainNameWithPrefix(.., "DN-"/"SN-"), MustFormatHashWithPrefix
// for bandwidth's ifb, and pkg/ip's commentForInstance/hashForNetwork,
// which 1.1.1 computes the same way where it has them).
func TestReferenceNames(t *testing.T) {
	const cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, c := range []struct {
		net, id, ifname                                     string
		chain, comment, dn, sn, nftComment, ifb, nftNetHash string
	}{
		{"mynet", "c1", "eth0", "CNI-f0bca4ac77cde1bf2f3da5df", "name: \"mynet\" id: \"c1\"", "CNI-DN-f0bca4ac77cde1bf2f3da", "CNI-SN-f0bca4ac77cde1bf2f3da", "d23676b4f2d9fe04-f4d01f2ef4b92245, net: mynet, if: eth0, id: c1", "bwpf0bca4ac77cd", "d23676b4f2d9fe04"},
		{"cbr0", cid, "eth0", "CNI-65299167c7285b471ffb1c3c", "name: \"cbr0\" id: \"" + cid + "\"", "CNI-DN-65299167c7285b471ffb1", "CNI-SN-65299167c7285b471ffb1", "cb6e746fae1a4d6c-848025970da6a998, net: cbr0, if: eth0, id: " + cid, "bwp65299167c728", "cb6e746fae1a4d6c"},
		{"we\"ird", "id-with-\"quote", "net1", "CNI-e45b2313e5a43ad56386fcd9", "name: \"we\\\"ird\" id: \"id-with-\\\"quote\"", "CNI-DN-e45b2313e5a43ad56386f", "CNI-SN-e45b2313e5a43ad56386f", "50574c923fc0a20a-12b997894fa50b73, net: weird, if: net1, id: id-with-quote", "bwpe45b2313e5a4", "50574c923fc0a20a"},
		// The nftables comment cut at 128 bytes.
		{"a-rather-long-network-name", cid, "eth0", "CNI-9870ed5c84e8cfb76dd75a03", "name: \"a-rather-long-network-name\" id: \"" + cid + "\"", "CNI-DN-9870ed5c84e8cfb76dd75", "CNI-SN-9870ed5c84e8cfb76dd75", "60391f2bbb4ec689-848025970da6a998, net: a-rather-long-network-name, if: eth0, id: 0123456789abcdef0123456789abcdef0123456789abcd", "bwp9870ed5c84e8", "60391f2bbb4ec689"},
	} {
		r := Reference{Network: c.net, ContainerID: c.id, IfName: c.ifname}
		for _, g := range []struct{ what, got, want string }{
			{"MasqChain", r.MasqChain(), c.chain},
			{"MasqComment", r.MasqComment(), c.comment},
			{"PortmapDNATChain", r.PortmapDNATChain(), c.dn},
			{"PortmapSNATChain", r.PortmapSNATChain(), c.sn},
			{"MasqNftComment", r.MasqNftComment(), c.nftComment},
			{"IfbName", r.IfbName(), c.ifb},
			{"RefMasqNftNetworkHash", RefMasqNftNetworkHash(c.net), c.nftNetHash},
			{"PortmapDNATComment", r.PortmapDNATComment(), `dnat name: "` + c.net + `" id: "` + c.id + `"`},
			{"PortmapNftComment", r.PortmapNftComment(), c.id},
		} {
			if g.got != g.want {
				t.Errorf("%+v.%s = %q, want %q", r, g.what, g.got, g.want)
			}
		}
		if len(r.MasqNftKey()) != 33 || r.MasqNftComment()[:33] != r.MasqNftKey() {
			t.Errorf("%+v: MasqNftKey %q does not start the comment %q", r, r.MasqNftKey(), r.MasqNftComment())
		}
	}
}

// TestReferenceIfbName: the value bandwidth's tests pinned before the name
// moved here.
func TestReferenceIfbName(t *testing.T) {
	if got := (Reference{Network: "net", ContainerID: "c1"}).IfbName(); got != "bwp623e1c388032" {
		t.Errorf("IfbName = %q, want bwp623e1c388032", got)
	}
}

// TestReferencePortmapCommentCut: the reference cuts iptables comments
// longer than 255 bytes to 253 and "...".
func TestReferencePortmapCommentCut(t *testing.T) {
	long := make([]byte, 300)
	for i := range long {
		long[i] = 'n'
	}
	got := Reference{Network: string(long), ContainerID: "c"}.PortmapDNATComment()
	if len(got) != 256 || got[253:] != "..." || got[:17] != `dnat name: "nnnnn` {
		t.Errorf("PortmapDNATComment = %q (%d bytes)", got, len(got))
	}
}
