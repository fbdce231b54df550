package fwtext

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// TestSetsText: set and element operations as nft and ipset read them;
// an ipset operation is not nft's, nor an nft set's ipset's, and a
// transaction built wrong renders as its error.
func TestSetsText(t *testing.T) {
	host := ruleset.TableID{Family: ruleset.Inet, Name: "istio-ambient-nat"}
	v4, v6 := ruleset.Set{Name: "probes-v4", Family: ruleset.V4}, ruleset.Set{Name: "probes-v6", Family: ruleset.V6}
	a, b := ruleset.Element{Addr: netip.MustParseAddr("10.0.0.5"), Comment: "uid-a"}, ruleset.Element{Addr: netip.MustParseAddr("10.0.0.6")}
	six := ruleset.Element{Addr: netip.MustParseAddr("fd50::5"), Comment: "uid-a"}

	nft := (&ruleset.Tx{}).AddSet(host, v4).FlushSet(host, v4).AddElements(host, v4, a, b).DestroyElements(host, v4, b).DestroySet(host, v6)
	got, err := NftScript(nft)
	want := `add set inet istio-ambient-nat probes-v4 { type ipv4_addr; }
flush set inet istio-ambient-nat probes-v4
add element inet istio-ambient-nat probes-v4 { 10.0.0.5, 10.0.0.6 }
delete element inet istio-ambient-nat probes-v4 { 10.0.0.6 }
add set inet istio-ambient-nat probes-v6 { type ipv6_addr; }
delete set inet istio-ambient-nat probes-v6
`
	if err != nil || got != want {
		t.Fatalf("nft:\n%s(%v)\nwant:\n%s", got, err, want)
	}
	in4, in6 := ruleset.IPSets(ruleset.V4), ruleset.IPSets(ruleset.V6)
	ipsets := (&ruleset.Tx{}).AddSet(in4, v4).AddSet(in6, v6).FlushSet(in4, v4).AddElements(in4, v4, a, b).AddElements(in6, v6, six).
		DestroyElements(in4, v4, b).DestroySet(in6, v6)
	got, err = IPSetRestore(ipsets)
	want = `create probes-v4 hash:ip family inet comment -exist
create probes-v6 hash:ip family inet6 comment -exist
flush probes-v4
add probes-v4 10.0.0.5 comment "uid-a" -exist
add probes-v4 10.0.0.6 -exist
add probes-v6 fd50::5 comment "uid-a" -exist
del probes-v4 10.0.0.6 -exist
destroy probes-v6
`
	if err != nil || got != want {
		t.Fatalf("ipset:\n%s(%v)\nwant:\n%s", got, err, want)
	}
	if _, err := IPSetRestore(nft); err == nil {
		t.Fatal("IPSetRestore rendered an nft set")
	}
	if _, err := IPTablesRestore(ipsets); err == nil {
		t.Fatal("IPTablesRestore rendered ipsets")
	}
	bad := (&ruleset.Tx{}).AddElements(host, v4, six)
	if _, err := NftScript(bad); err == nil || !strings.Contains(err.Error(), "not an address of IPv4") {
		t.Fatalf("a transaction built wrong: %v", err)
	}
	// The runs of ipset operations and of the others, in order.
	mixed := (&ruleset.Tx{}).AddSet(in4, v4).AddChain(ruleset.TableID{Family: ruleset.IP, Name: "nat"}, ruleset.Chain{Name: "X"}).AddElements(in4, v4, a)
	parts := SplitIPSets(mixed)
	if len(parts) != 3 || !IsIPSets(parts[0]) || IsIPSets(parts[1]) || !IsIPSets(parts[2]) {
		t.Fatalf("SplitIPSets: %d parts", len(parts))
	}
}
