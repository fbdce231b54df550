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
// a table name such as "nat"), all of one family, and in the ipsets of
// that family (IPSets); the tables exist, and are never added or
// removed. A native nftables transaction works in tables of meshwire's
// own, of any family, and in their sets.
//
// A transaction built wrong (an operation without a name, an address of
// the wrong family) keeps its first error (Err), as knftables' does: the
// operation is not added, later ones still are, and every firewall
// refuses to apply it with that error.
type Tx struct {
	ops []Op
	err error
}

// Err is the first error of the transaction's building, or nil.
func (tx *Tx) Err() error {
	if tx == nil {
		return nil
	}
	return tx.err
}

// fail keeps err, the first one.
func (tx *Tx) fail(err error) *Tx {
	if tx.err == nil {
		tx.err = err
	}
	return tx
}

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
// Chain, Rule, Ref and Set are nil (Def is the table written by Add,
// Create and Replace), a chain operation with Chain, a rule operation
// with Rule or Ref, a set operation with Set, and an operation on a set's
// elements with Set and Elements.
type Op struct {
	Verb     Verb
	Table    TableID
	Def      *Table
	Chain    *Chain
	Rule     *Rule
	Ref      *RuleRef
	Set      *Set
	Elements []Element
	Index    int // Insert
}

// Object is what the operation works on: "table", "chain", "rule", "set"
// or "element".
func (o Op) Object() string {
	switch {
	case o.Chain != nil:
		return "chain"
	case o.Rule != nil || o.Ref != nil:
		return "rule"
	case o.Set != nil && o.Elements != nil:
		return "element"
	case o.Set != nil:
		return "set"
	}
	return "table"
}

// IPSet tells whether the operation works on an ipset (a set, or its
// elements, of the iptables backends).
func (o Op) IPSet() bool { return o.Set != nil && o.Table.IsIPSets() }

// ChainName is the chain the operation works in ("" for a table).
func (o Op) ChainName() string {
	switch {
	case o.Chain != nil:
		return o.Chain.Name
	case o.Rule != nil:
		return o.Rule.Chain
	case o.Ref != nil:
		return o.Ref.Chain
	case o.Set != nil:
		return o.Set.Name
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

// Append adds the operations of other, after tx's (and its error, when
// tx has none).
func (tx *Tx) Append(other *Tx) {
	if other != nil {
		tx.ops = append(tx.ops, other.ops...)
		if other.err != nil {
			tx.fail(other.err)
		}
	}
}

// AppendOps adds operations, after tx's.
func (tx *Tx) AppendOps(ops ...Op) *Tx { tx.ops = append(tx.ops, ops...); return tx }

func (tx *Tx) op(o Op) *Tx { return tx.AppendOps(o) }

func (tx *Tx) table(v Verb, t Table) *Tx {
	if t.Name == "" {
		return tx.fail(fmt.Errorf("%s table: a table without a name", v))
	}
	return tx.op(Op{Verb: v, Table: t.ID(), Def: &t})
}

// chain adds a chain operation, refusing a chain without a name.
func (tx *Tx) chain(o Op) *Tx {
	if o.Chain.Name == "" {
		return tx.fail(fmt.Errorf("%s chain in %s: a chain without a name", o.Verb, o.Table))
	}
	return tx.op(o)
}

// rule adds a rule operation, refusing a rule of no chain.
func (tx *Tx) rule(o Op) *Tx {
	if o.ChainName() == "" {
		return tx.fail(fmt.Errorf("%s rule in %s: a rule of no chain", o.Verb, o.Table))
	}
	if o.Index < 0 {
		return tx.fail(fmt.Errorf("insert rule in %s %s: index %d", o.Table, o.ChainName(), o.Index))
	}
	return tx.op(o)
}

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
func (tx *Tx) AddChain(id TableID, c Chain) *Tx { return tx.chain(Op{Verb: Add, Table: id, Chain: &c}) }

// CreateChain makes a chain, failing when it is there.
func (tx *Tx) CreateChain(id TableID, c Chain) *Tx {
	return tx.chain(Op{Verb: Create, Table: id, Chain: &c})
}

// FlushChain empties a chain.
func (tx *Tx) FlushChain(id TableID, name string) *Tx {
	return tx.chain(Op{Verb: Flush, Table: id, Chain: &Chain{Name: name}})
}

// DeleteChain removes a chain.
func (tx *Tx) DeleteChain(id TableID, name string) *Tx {
	return tx.chain(Op{Verb: Delete, Table: id, Chain: &Chain{Name: name}})
}

// AddRule appends r to its chain.
func (tx *Tx) AddRule(id TableID, r Rule) *Tx { return tx.rule(Op{Verb: Add, Table: id, Rule: &r}) }

// InsertRule puts r at index (0: the head) of its chain.
func (tx *Tx) InsertRule(id TableID, index int, r Rule) *Tx {
	return tx.rule(Op{Verb: Insert, Table: id, Rule: &r, Index: index})
}

// DeleteRule removes the rule of r's chain whose iptables form is r's
// (iptables tables only: nftables deletes rules by handle, DeleteRef).
func (tx *Tx) DeleteRule(id TableID, r Rule) *Tx {
	return tx.rule(Op{Verb: Delete, Table: id, Rule: &r})
}

// DeleteRef removes a rule read back.
func (tx *Tx) DeleteRef(id TableID, ref RuleRef) *Tx {
	return tx.rule(Op{Verb: Delete, Table: id, Ref: &ref})
}
