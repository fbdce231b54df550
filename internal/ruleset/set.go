package ruleset

import (
	"fmt"
	"net/netip"
)

// Sets of addresses, as a transaction works on them (knftables' Set and
// Element). With native nftables a set lives in a table of meshwire's
// (Table.Sets, or AddSet with the table's ID); with the iptables backends
// it is an ipset of the namespace, outside every table, named by IPSets
// as a transaction's table. Rules match a set by name (MatchDstSet) either
// way.

// Set is a named set of addresses of one family: nftables' type
// ipv4_addr or ipv6_addr; an ipset of type hash:ip, family inet or inet6,
// whose elements carry a comment.
type Set struct {
	Name   string
	Family IPVersion
}

// NftType is the set's nftables type.
func (s Set) NftType() string {
	if s.Family == V6 {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

// IPSets is what a transaction names as the table of the ipsets of
// family f (the iptables backends' sets): family IP or IP6, no name.
func IPSets(f IPVersion) TableID { return TableID{Family: f.Tables()} }

// IsIPSets tells whether id names the ipsets (IPSets).
func (id TableID) IsIPSets() bool { return id.Name == "" && (id.Family == IP || id.Family == IP6) }

// Element is a member of a set: an address, and (in an ipset) a comment,
// which names the pod it is there for.
type Element struct {
	Addr    netip.Addr
	Comment string
}

// AddSet makes set s in table id when it is not there (an ipset with
// IPSets); one that is there keeps its elements.
func (tx *Tx) AddSet(id TableID, s Set) *Tx {
	if err := checkSet(id, s); err != nil {
		return tx.fail(err)
	}
	return tx.op(Op{Verb: Add, Table: id, Set: &s})
}

// FlushSet removes every element of set s.
func (tx *Tx) FlushSet(id TableID, s Set) *Tx {
	if err := checkSet(id, s); err != nil {
		return tx.fail(err)
	}
	return tx.op(Op{Verb: Flush, Table: id, Set: &s})
}

// DestroySet removes set s when it is there (no rule may use it).
func (tx *Tx) DestroySet(id TableID, s Set) *Tx {
	if err := checkSet(id, s); err != nil {
		return tx.fail(err)
	}
	return tx.op(Op{Verb: Destroy, Table: id, Set: &s})
}

// AddElements adds elements to set s; one that is there is no error (an
// ipset's comment is replaced).
func (tx *Tx) AddElements(id TableID, s Set, elems ...Element) *Tx {
	return tx.elements(Add, id, s, elems)
}

// DestroyElements removes the elements of set s that are there; one that
// is not, or a set that is not there, is no error.
func (tx *Tx) DestroyElements(id TableID, s Set, elems ...Element) *Tx {
	return tx.elements(Destroy, id, s, elems)
}

func (tx *Tx) elements(v Verb, id TableID, s Set, elems []Element) *Tx {
	if err := checkSet(id, s); err != nil {
		return tx.fail(err)
	}
	if len(elems) == 0 {
		return tx
	}
	for _, e := range elems {
		if !e.Addr.IsValid() || (e.Addr.Is4() != (s.Family == V4)) {
			return tx.fail(fmt.Errorf("set %s: %v is not an address of %v", s.Name, e.Addr, s.Family))
		}
	}
	return tx.op(Op{Verb: v, Table: id, Set: &s, Elements: append([]Element(nil), elems...)})
}

// checkSet refuses a set without a name or family, and an ipset whose
// family is not its table's.
func checkSet(id TableID, s Set) error {
	switch {
	case s.Name == "":
		return fmt.Errorf("a set without a name in %s", id)
	case s.Family != V4 && s.Family != V6:
		return fmt.Errorf("set %s has no address family", s.Name)
	case id.IsIPSets() && id.Family != s.Family.Tables():
		return fmt.Errorf("ipset %s of %v named as a set of %s", s.Name, s.Family, id.Family)
	case id.Name == "" && !id.IsIPSets():
		return fmt.Errorf("set %s: a table without a name", s.Name)
	}
	return nil
}
