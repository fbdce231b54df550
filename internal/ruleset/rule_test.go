package ruleset

import (
	"testing"
)

func TestFamilies(t *testing.T) {
	for _, f := range []Family{IP, IP6, Inet, Bridge, ARP, Netdev} {
		if g, err := ParseFamily(f.String()); err != nil || g != f {
			t.Errorf("%s: %v %v", f, g, err)
		}
	}
	if _, err := ParseFamily("ipx"); err == nil {
		t.Error("ipx parsed")
	}
	if V6.Tables() != IP6 || V4.Tables() != IP || V4.String() != "IPv4" {
		t.Error("IP versions")
	}
}
