package ruleset

import (
	"net/netip"
	"strings"
	"testing"
)

// TestStickyError: an operation built wrong is not added and the
// transaction keeps the first such error, as knftables' does; later
// operations still are, and a transaction appended carries its error.
func TestStickyError(t *testing.T) {
	nat := TableID{Family: IP, Name: "nat"}
	v4 := Set{Name: "probes-v4", Family: V4}
	for _, c := range []struct {
		name  string
		build func(tx *Tx)
		want  string
	}{
		{"a table without a name", func(tx *Tx) { tx.AddTable(Table{Family: Inet}) }, "without a name"},
		{"a chain without a name", func(tx *Tx) { tx.AddChain(nat, Chain{}) }, "chain without a name"},
		{"a rule of no chain", func(tx *Tx) { tx.AddRule(nat, Rule{}) }, "of no chain"},
		{"a negative index", func(tx *Tx) { tx.InsertRule(nat, -1, Rule{Chain: "X"}) }, "index -1"},
		{"a set without a name", func(tx *Tx) { tx.AddSet(IPSets(V4), Set{Family: V4}) }, "without a name"},
		{"a set without a family", func(tx *Tx) { tx.AddSet(IPSets(V4), Set{Name: "s"}) }, "no address family"},
		{"an ipset of the other family", func(tx *Tx) { tx.AddSet(IPSets(V6), v4) }, "named as a set of"},
		{"an element of the other family", func(tx *Tx) {
			tx.AddElements(IPSets(V4), v4, Element{Addr: netip.MustParseAddr("fd50::1")})
		}, "not an address of IPv4"},
		{"an element with no address", func(tx *Tx) { tx.DestroyElements(IPSets(V4), v4, Element{}) }, "not an address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx := &Tx{}
			c.build(tx)
			tx.AddChain(nat, Chain{Name: "AFTER"})
			if tx.Err() == nil || !strings.Contains(tx.Err().Error(), c.want) {
				t.Fatalf("Err() = %v, want one with %q", tx.Err(), c.want)
			}
			if tx.Len() != 1 || tx.Ops()[0].ChainName() != "AFTER" {
				t.Fatalf("ops %v: the wrong one added, or the next one not", tx.Ops())
			}
			all := &Tx{}
			all.Append(tx)
			if all.Err() != tx.Err() {
				t.Fatalf("appended: %v", all.Err())
			}
		})
	}
	if err := (&Tx{}).AddSet(IPSets(V4), v4).AddElements(IPSets(V4), v4, Element{Addr: netip.MustParseAddr("10.0.0.1")}).Err(); err != nil {
		t.Fatalf("a good transaction: %v", err)
	}
}

// TestSetOps: set and element operations say what they work on.
func TestSetOps(t *testing.T) {
	host := TableID{Family: Inet, Name: "istio-ambient-nat"}
	s := Set{Name: "p", Family: V6}
	a := Element{Addr: netip.MustParseAddr("fd50::5"), Comment: "uid"}
	tx := (&Tx{}).AddSet(host, s).FlushSet(host, s).AddElements(host, s, a).DestroyElements(host, s, a).DestroySet(host, s).
		AddElements(host, s) // nothing to add: no operation
	var got []string
	for _, o := range tx.Ops() {
		got = append(got, o.String())
	}
	want := "add set inet istio-ambient-nat p|flush set inet istio-ambient-nat p|add element inet istio-ambient-nat p|destroy element inet istio-ambient-nat p|destroy set inet istio-ambient-nat p"
	if strings.Join(got, "|") != want {
		t.Fatalf("ops %q, want %q", got, want)
	}
	if tx.Ops()[0].IPSet() || !(Op{Table: IPSets(V6), Set: &s}).IPSet() || s.NftType() != "ipv6_addr" {
		t.Fatal("IPSet or NftType")
	}
}
