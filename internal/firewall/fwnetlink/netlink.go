// Package fwnetlink is the firewall over netlink (internal/nftnl), for
// everything that lives in nf_tables. It does typed reads of tables, chains and
// rules (native nftables tables and an nf_tables-backed iptables' alike,
// decoded into package installed's types), and the transactions
// (ruleset.Tx) that are written with no tool: a table of meshwire's own
// replaced whole, tables removed, rules read back removed by handle, and
// masquerade rules appended to an iptables-nft table as iptables-nft
// encodes them.
package fwnetlink

import (
	"fmt"

	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// ReadTable reads a table with its chains and their rules; nil when the
// table is not there.
func ReadTable(c *nftnl.Conn, fam ruleset.Family, name string) (*installed.Table, error) {
	return readTable(c, fam, name)
}

// ReadChain reads one chain with its rules; nil when the chain (or its
// table) is not there.
func ReadChain(c *nftnl.Conn, fam ruleset.Family, table, chain string) (*installed.Chain, error) {
	return readChain(c, fam, table, chain)
}

// HasTable tells whether a table is there (one request).
func HasTable(c *nftnl.Conn, fam ruleset.Family, name string) (bool, error) {
	return hasTable(c, fam, name)
}

// HasChain tells whether a chain is there (one request).
func HasChain(c *nftnl.Conn, fam ruleset.Family, table, chain string) (bool, error) {
	return hasChain(c, fam, table, chain)
}

// ChainNames lists the chains of a table with one chain dump; none when
// the table is not there.
func ChainNames(c *nftnl.Conn, fam ruleset.Family, table string) ([]string, error) {
	return chainNames(c, fam, table)
}

// Batch is a transaction as one netlink batch writes it.
type Batch struct {
	replace *ruleset.Table
	fam     ruleset.Family
	tables  []string
	deletes []nftnl.RuleID
	appends []nftnl.NewRule
}

// Encode returns the netlink batch of tx, or false when tx is not one
// that is written over netlink: one table replaced (Tx.ReplaceTable, one
// base chain, encodable rules); tables of one family destroyed; rules
// read back from nf_tables deleted by handle; or, with iptables (the
// iptables tables are nf_tables-backed), masquerade rules appended to
// iptables tables (see encode.go).
func Encode(tx *ruleset.Tx, iptables bool) (*Batch, bool) {
	ops := tx.Ops()
	if len(ops) == 0 {
		return nil, false
	}
	b := &Batch{fam: ops[0].Table.Family}
	for _, o := range ops {
		switch {
		case o.Verb == ruleset.Replace && o.Object() == "table" && len(ops) == 1:
			if _, _, err := CheckTable(*o.Def); err != nil {
				return nil, false
			}
			b.replace = o.Def
		case o.Verb == ruleset.Destroy && o.Object() == "table" && o.Table.Family == b.fam && len(b.deletes)+len(b.appends) == 0:
			b.tables = append(b.tables, o.Table.Name)
		case o.Verb == ruleset.Delete && o.Ref != nil && o.Ref.Handle != 0 && len(b.tables)+len(b.appends) == 0:
			b.deletes = append(b.deletes, nftnl.RuleID{Family: o.Table.Family, Table: o.Table.Name, Chain: o.Ref.Chain, Handle: o.Ref.Handle})
		case o.Verb == ruleset.Add && o.Rule != nil && iptables && len(b.tables)+len(b.deletes) == 0 &&
			o.Rule.Family.Tables() == o.Table.Family:
			nr, err := encodeRule(o.Table.Name, *o.Rule)
			if err != nil {
				return nil, false
			}
			b.appends = append(b.appends, nr)
		default:
			return nil, false
		}
	}
	return b, true
}

// Apply writes the batch in one transaction.
func (b *Batch) Apply(c *nftnl.Conn) error {
	switch {
	case b.replace != nil:
		rules, bc, err := CheckTable(*b.replace)
		if err != nil {
			return err
		}
		return c.ReplaceTable(b.replace.Family, b.replace.Name, b.replace.Comment, bc, rules)
	case len(b.tables) > 0:
		return c.DeleteTables(b.fam, b.tables)
	case len(b.deletes) > 0:
		return c.DeleteRules(b.deletes)
	case len(b.appends) > 0:
		return c.AppendRules(b.appends)
	}
	return fmt.Errorf("an empty netlink batch")
}
