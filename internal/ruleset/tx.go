package ruleset

import "fmt"

// Tx is one firewall transaction, in the manner of knftables: typed
// operations on tables, chains and rules, applied in order and all or
// nothing. Features build it; the firewall (internal/firewall) renders it
// for the backend (one iptables-restore of one address family, one nft -f
// script, or one netlink batch) and the fake (internal/firewall/fwfake)
// applies the same operations to its tables.
//
// An iptables transaction works in iptables tables (family IP or IP6 and
// a table name such as "nat"), all of one family; they exist, and are
// never added or removed. A native nftables transaction works in tables of
// meshwire's own, of any family.
type Tx struct{ ops []Op }

// Verb is what an operation does.
type Verb uint8

const (
	// Add makes a table or chain when it is not there (a table given with
	// chains writes them and their rules with it; a chain of an iptables
	// table is also emptied, as iptables-restore's ":CHAIN" declaration
	// does); of a rule, appends it.
	Add Verb = iota + 1
	// Create makes a table or chain, failing when it is there.
	Create
	// Insert puts a rule at Index (0: the head of the chain).
	Insert
	// Flush empties a chain, or every chain of a table.
	Flush
	// Delete removes a table (with everything in it) or a chain (which
	// must hold no rule, in iptables, and not be jumped to), failing when
	// it is not there; of a rule, removes it (Ref: one read back; Rule:
	// one with the same iptables form).
	Delete
	// Destroy removes a table when it is there.
	Destroy
	// Replace puts a table in place whole: it is removed when there and
	// written anew from the Table.
	Replace
)

var verbs = [...]string{Add: "add", Create: "create", Insert: "insert", Flush: "flush", Delete: "delete", Destroy: "destroy", Replace: "replace"}

func (v Verb) String() string {
	if int(v) < len(verbs) && verbs[v] != "" {
		return verbs[v]
	}
	return fmt.Sprintf("verb-%d", v)
}

// TableID names a table: an iptables table of V4 is (IP, "nat").
type TableID struct {
	Family Family
	Name   string
}

func (id TableID) String() string { return id.Family.String() + " " + id.Name }

// RuleRef names a rule read back from the host, for its deletion: by its
// nf_tables Handle, else by its iptables form (Spec, as iptables-save
// prints it after "-A CHAIN"), else by its 1-based Position.
type RuleRef struct {
	Chain    string
	Handle   uint64
	Spec     string
	Position int
}

// Op is one operation of a transaction, on Table: a table operation when
// Chain, Rule and Ref are nil (Def is the table written by Add, Create
// and Replace), a chain operation with Chain, a rule operation with Rule
// or Ref.
type Op struct {
	Verb  Verb
	Table TableID
	Def   *Table
	Chain *Chain
	Rule  *Rule
	Ref   *RuleRef
	Index int // Insert
}

// Object is what the operation works on: "table", "chain" or "rule".
func (o Op) Object() string {
	switch {
	case o.Chain != nil:
		return "chain"
	case o.Rule != nil || o.Ref != nil:
		return "rule"
	}
	return "table"
}

// ChainName is the chain the operation works in ("" for a table).
func (o Op) ChainName() string {
	switch {
	case o.Chain != nil:
		return o.Chain.Name
	case o.Rule != nil:
		return o.Rule.Chain
	case o.Ref != nil:
		return o.Ref.Chain
	}
	return ""
}

func (o Op) String() string {
	s := o.Verb.String() + " " + o.Object() + " " + o.Table.String()
	if c := o.ChainName(); c != "" {
		s += " " + c
	}
	return s
}

// Ops are the operations in order.
func (tx *Tx) Ops() []Op { return tx.ops }

// Empty reports whether the transaction does nothing.
func (tx *Tx) Empty() bool { return tx == nil || len(tx.ops) == 0 }

// Len is the number of operations.
func (tx *Tx) Len() int { return len(tx.ops) }

// OnlyAddsRules reports whether every operation appends a rule.
func (tx *Tx) OnlyAddsRules() bool {
	for _, o := range tx.Ops() {
		if o.Verb != Add || o.Rule == nil {
			return false
		}
	}
	return !tx.Empty()
}

// Append adds the operations of other, after tx's.
func (tx *Tx) Append(other *Tx) {
	if other != nil {
		tx.ops = append(tx.ops, other.ops...)
	}
}

// AppendOps adds operations, after tx's.
func (tx *Tx) AppendOps(ops ...Op) *Tx { tx.ops = append(tx.ops, ops...); return tx }

func (tx *Tx) op(o Op) *Tx { return tx.AppendOps(o) }

func (tx *Tx) table(v Verb, t Table) *Tx { return tx.op(Op{Verb: v, Table: t.ID(), Def: &t}) }

// AddTable makes t when it is not there, with its chains and rules.
func (tx *Tx) AddTable(t Table) *Tx { return tx.table(Add, t) }

// CreateTable makes t, failing when it is there.
func (tx *Tx) CreateTable(t Table) *Tx { return tx.table(Create, t) }

// ReplaceTable puts t in place whole, replacing the table when it is
// there.
func (tx *Tx) ReplaceTable(t Table) *Tx { return tx.table(Replace, t) }

// DeleteTable removes a table, failing when it is not there.
func (tx *Tx) DeleteTable(id TableID) *Tx { return tx.op(Op{Verb: Delete, Table: id}) }

// DestroyTable removes a table when it is there.
func (tx *Tx) DestroyTable(id TableID) *Tx { return tx.op(Op{Verb: Destroy, Table: id}) }

// AddChain makes a chain when it is not there (an iptables chain is also
// emptied).
func (tx *Tx) AddChain(id TableID, c Chain) *Tx { return tx.op(Op{Verb: Add, Table: id, Chain: &c}) }

// CreateChain makes a chain, failing when it is there.
func (tx *Tx) CreateChain(id TableID, c Chain) *Tx {
	return tx.op(Op{Verb: Create, Table: id, Chain: &c})
}

// FlushChain empties a chain.
func (tx *Tx) FlushChain(id TableID, name string) *Tx {
	return tx.op(Op{Verb: Flush, Table: id, Chain: &Chain{Name: name}})
}

// DeleteChain removes a chain.
func (tx *Tx) DeleteChain(id TableID, name string) *Tx {
	return tx.op(Op{Verb: Delete, Table: id, Chain: &Chain{Name: name}})
}

// AddRule appends r to its chain.
func (tx *Tx) AddRule(id TableID, r Rule) *Tx { return tx.op(Op{Verb: Add, Table: id, Rule: &r}) }

// InsertRule puts r at index (0: the head) of its chain.
func (tx *Tx) InsertRule(id TableID, index int, r Rule) *Tx {
	return tx.op(Op{Verb: Insert, Table: id, Rule: &r, Index: index})
}

// DeleteRule removes the rule of r's chain whose iptables form is r's
// (iptables tables only: nftables deletes rules by handle, DeleteRef).
func (tx *Tx) DeleteRule(id TableID, r Rule) *Tx { return tx.op(Op{Verb: Delete, Table: id, Rule: &r}) }

// DeleteRef removes a rule read back.
func (tx *Tx) DeleteRef(id TableID, ref RuleRef) *Tx {
	return tx.op(Op{Verb: Delete, Table: id, Ref: &ref})
}
