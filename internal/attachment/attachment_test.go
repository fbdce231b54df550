package attachment

import (
	"slices"
	"strings"
	"testing"
)

var att = ID{Network: "net", ContainerID: "c1", IfName: "eth0"}

// TestNames pins every current name: the host veth, masquerade and mac
// spoof names are those meshwire gave before this package (unchanged), the
// port mapping key and the ifb are the new forms.
func TestNames(t *testing.T) {
	for _, c := range []struct{ what, got, want string }{
		{"Hash", att.Hash()[:16], "d72e032fedd94c16"},
		{"HostVeth default", att.HostVeth(""), "vethd72e032fedd"},
		{"HostVeth veth", att.HostVeth("veth"), "vethd72e032fedd"},
		{"HostVeth mwtb", att.HostVeth("mwtb"), "mwtbd72e032fedd"},
		{"HostVeth longest prefix", att.HostVeth("abcdefghijk"), "abcdefghijkd72e"},
		{"HostVeth short prefix", att.HostVeth("v"), "vd72e032fedd94c"},
		{"MasqTag", att.MasqTag(), "MW-a08a0fcb-d72e032fedd94c1"},
		{"MasqTable", att.MasqTable(), "meshwire_masq_a08a0fcb_d72e032fedd94c1"},
		{"MacSpoofTable", att.MacSpoofTable(), "meshwire_macspoof_a08a0fcb_d72e032fedd94c1"},
		{"PortmapKey", att.PortmapKey(), "d72e032fedd94c16"},
		{"Ifb", att.Ifb(), "mwbwd72e032fedd"},
		{"NetworkTag plain", NetworkTag("net"), "net"},
		{"NetworkTag odd", NetworkTag("a b"), "sha256-c8687a08aa5d6ed2"},
		{"NetworkTag long", NetworkTag(strings.Repeat("n", 65)), "sha256-" + NetworkHash(strings.Repeat("n", 65))[:16]},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
		}
	}
	for _, n := range []string{att.HostVeth(""), att.HostVeth("abcdefghijk"), att.Ifb()} {
		if len(n) != IFNameSize {
			t.Errorf("%q is not %d bytes", n, IFNameSize)
		}
	}
	if len(att.MasqTag()) != 27 || len(att.MasqTable()) != 38 || len(att.MacSpoofTable()) != 42 {
		t.Errorf("lengths of %q %q %q", att.MasqTag(), att.MasqTable(), att.MacSpoofTable())
	}
	if !strings.HasPrefix(att.MasqTag(), MasqTagPrefix("net")) || !strings.HasPrefix(att.MasqTable(), MasqTablePrefix("net")) || !strings.HasPrefix(att.MacSpoofTable(), MacSpoofTablePrefix("net")) {
		t.Error("a name does not start with its network's prefix")
	}
}

// The older forms, one test each, pinned to what meshwire up to commit
// ee1ca85 computed for the same attachment.

func TestLegacyPortmapKey(t *testing.T) {
	if got := LegacyPortmapKey("c1", "eth0"); got != "ec43057c07aaa51f" {
		t.Fatalf("LegacyPortmapKey = %q", got)
	}
	if want := []string{"d72e032fedd94c16", "ec43057c07aaa51f"}; !slices.Equal(att.PortmapKeys(), want) {
		t.Fatalf("PortmapKeys = %q, want %q", att.PortmapKeys(), want)
	}
}

func TestLegacyIfb(t *testing.T) {
	if got := LegacyIfb("net", "c1", "eth0"); got != "mwbw26026bd18b7" {
		t.Fatalf("LegacyIfb = %q", got)
	}
	if want := []string{"mwbwd72e032fedd", "mwbw26026bd18b7"}; !slices.Equal(att.IfbNames(), want) {
		t.Fatalf("IfbNames = %q, want %q", att.IfbNames(), want)
	}
}

func TestLegacyBandwidthNetworkTag(t *testing.T) {
	if got := LegacyBandwidthNetworkTag("net"); got != "a08a0fcbdeaf" {
		t.Fatalf("LegacyBandwidthNetworkTag = %q", got)
	}
	if want := []string{"net", "a08a0fcbdeaf"}; !slices.Equal(NetworkTags("net"), want) {
		t.Fatalf("NetworkTags = %q, want %q", NetworkTags("net"), want)
	}
}

// TestDistinct: what differs in an attachment differs in its names; the
// network is in the names GC scopes by network, not in the others.
func TestDistinct(t *testing.T) {
	names := func(a ID) []string {
		return []string{a.HostVeth(""), a.MasqTag(), a.MasqTable(), a.MacSpoofTable(), a.PortmapKey(), a.Ifb()}
	}
	base := names(att)
	for _, other := range []ID{{Network: "net", ContainerID: "c2", IfName: "eth0"}, {Network: "net", ContainerID: "c1", IfName: "eth1"}, {Network: "net", ContainerID: "c", IfName: "1eth0"}} {
		for i, n := range names(other) {
			if n == base[i] {
				t.Errorf("%+v and %+v share %q", att, other, n)
			}
		}
	}
	renamed := ID{Network: "other", ContainerID: "c1", IfName: "eth0"}
	if renamed.HostVeth("") != att.HostVeth("") || renamed.PortmapKey() != att.PortmapKey() || renamed.Ifb() != att.Ifb() {
		t.Error("the network changes a name it is not part of")
	}
	if renamed.MasqTag() == att.MasqTag() || renamed.MasqTable() == att.MasqTable() || renamed.MacSpoofTable() == att.MacSpoofTable() {
		t.Error("the network does not change a name GC scopes by network")
	}
}
