package fwfake

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// builtinChains are the built-in chains of each iptables table.
var builtinChains = map[string][]string{
	"filter":   {"INPUT", "FORWARD", "OUTPUT"},
	"nat":      {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle":   {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":      {"PREROUTING", "OUTPUT"},
	"security": {"INPUT", "FORWARD", "OUTPUT"},
}

// isIPTables: id is an iptables table of this firewall's iptables (any
// other table is a native nftables one).
func (f *Fake) isIPTables(id ruleset.TableID) bool {
	_, ok := builtinChains[id.Name]
	return ok && f.b.Kind == firewall.IPTables && (id.Family == ruleset.IP || id.Family == ruleset.IP6)
}

func builtins(id ruleset.TableID) []*installed.Chain {
	var out []*installed.Chain
	for _, c := range builtinChains[id.Name] {
		out = append(out, &installed.Chain{Family: id.Family, Table: id.Name, Name: c, Hook: ruleset.BuiltinHook(c)})
	}
	return out
}

// apply applies one operation to state.
func (f *Fake) apply(state map[ruleset.TableID]*table, ipsets sets, o ruleset.Op, netlink bool) error {
	if o.Set != nil {
		return f.applySetOp(state, ipsets, o)
	}
	t := state[o.Table]
	if f.isIPTables(o.Table) {
		if o.Object() == "table" {
			return fmt.Errorf("iptables tables are neither added nor removed")
		}
		if t == nil && !netlink {
			// The kernel makes an iptables table on its first use.
			t = &table{iptables: true, chains: builtins(o.Table)}
			state[o.Table] = t
		}
	}
	if o.Object() == "table" {
		return applyTable(state, o)
	}
	if t == nil {
		return fmt.Errorf("no table %s: %w", o.Table, unix.ENOENT)
	}
	if o.Object() == "chain" {
		return t.applyChain(o)
	}
	return t.applyRule(o, ipsets)
}

func applyTable(state map[ruleset.TableID]*table, o ruleset.Op) error {
	t := state[o.Table]
	switch o.Verb {
	case ruleset.Add, ruleset.Create, ruleset.Replace:
		switch {
		case t != nil && o.Verb == ruleset.Create:
			return fmt.Errorf("table exists: %w", unix.EEXIST)
		case t == nil || o.Verb == ruleset.Replace:
			t = &table{}
			state[o.Table] = t
		}
		return t.define(o.Table, o.Def)
	case ruleset.Delete, ruleset.Destroy:
		if t == nil && o.Verb == ruleset.Delete {
			return fmt.Errorf("no such table: %w", unix.ENOENT)
		}
		delete(state, o.Table)
	case ruleset.Flush:
		if t == nil {
			return fmt.Errorf("no such table: %w", unix.ENOENT)
		}
		for _, c := range t.chains {
			c.Rules = nil
		}
	default:
		return fmt.Errorf("not a table operation")
	}
	return nil
}

// define writes a table's comment and chains, as nft does a table block:
// the chains are declared before their rules are added, so that a rule
// may jump to a chain further down.
func (t *table) define(id ruleset.TableID, def *ruleset.Table) error {
	if def == nil {
		return nil
	}
	if t.sets == nil {
		t.sets = sets{}
	}
	for _, s := range def.Sets {
		if err := t.sets.declare(s); err != nil {
			return err
		}
	}
	if def.Comment != "" {
		t.comment = def.Comment
	}
	for _, c := range def.Chains {
		t.declare(id, c)
	}
	for _, c := range def.Chains {
		ch := t.chain(c.Name)
		for _, r := range c.Rules {
			err := checkSets(t.sets, r)
			if err == nil {
				err = t.addRule(ch, readBack(id.Family, r, false), setsMatched(r), -1)
			}
			if err != nil {
				return fmt.Errorf("chain %s: %w", c.Name, err)
			}
		}
	}
	return nil
}

// declare makes a chain when it is not there, with its hook and comment.
func (t *table) declare(id ruleset.TableID, c ruleset.Chain) *installed.Chain {
	ch := t.chain(c.Name)
	if ch == nil {
		ch = &installed.Chain{Family: id.Family, Table: id.Name, Name: c.Name}
		t.chains = append(t.chains, ch)
	}
	if c.Base != nil {
		ch.Hook = c.Base.Hook
	}
	if c.Comment != "" {
		ch.Comment = c.Comment
	}
	return ch
}

func (t *table) applyChain(o ruleset.Op) error {
	name := o.Chain.Name
	c := t.chain(name)
	switch o.Verb {
	case ruleset.Add, ruleset.Create:
		switch {
		case c != nil && o.Verb == ruleset.Create:
			return fmt.Errorf("chain exists: %w", unix.EEXIST)
		case c != nil && t.iptables && c.Hook == "":
			c.Rules = nil // iptables-restore's declaration empties it
		}
		t.declare(o.Table, *o.Chain)
		return nil
	}
	if c == nil {
		return fmt.Errorf("no such chain: %w", unix.ENOENT)
	}
	switch o.Verb {
	case ruleset.Flush:
		c.Rules = nil
	case ruleset.Delete:
		switch {
		case t.iptables && c.Hook != "":
			return fmt.Errorf("cannot delete built-in chain")
		case t.iptables && len(c.Rules) > 0:
			return fmt.Errorf("directory not empty: %w", unix.ENOTEMPTY)
		case t.iptables && t.referenced(name):
			return fmt.Errorf("too many links: %w", unix.EMLINK)
		case t.referenced(name):
			// As the kernel: the chain's own rules go with it; rules of
			// other chains that jump to it keep it (EBUSY).
			return fmt.Errorf("chain in use: %w", unix.EBUSY)
		}
		t.chains = slices.DeleteFunc(t.chains, func(x *installed.Chain) bool { return x.Name == name })
	default:
		return fmt.Errorf("not a chain operation")
	}
	return nil
}

func (t *table) applyRule(o ruleset.Op, ipsets sets) error {
	c := t.chain(o.ChainName())
	if c == nil {
		return fmt.Errorf("no such chain: %w", unix.ENOENT)
	}
	switch o.Verb {
	case ruleset.Add, ruleset.Insert:
		at := -1
		if o.Verb == ruleset.Insert {
			at = o.Index
		}
		have := t.sets
		if t.iptables {
			have = ipsets
		}
		if err := checkSets(have, *o.Rule); err != nil {
			return err
		}
		return t.addRule(c, readBack(o.Table.Family, *o.Rule, t.iptables), setsMatched(*o.Rule), at)
	case ruleset.Delete:
		i := t.find(c, o)
		if i < 0 {
			return fmt.Errorf("no such rule (does a matching rule exist in that chain?): %w", unix.ENOENT)
		}
		c.Rules = slices.Delete(c.Rules, i, i+1)
		return nil
	}
	return fmt.Errorf("not a rule operation")
}

// find is the index of the rule a Delete names, -1 when none.
func (t *table) find(c *installed.Chain, o ruleset.Op) int {
	if o.Rule != nil {
		spec := fwtext.IPTablesSpec(*o.Rule)
		return slices.IndexFunc(c.Rules, func(x installed.Rule) bool { return x.Spec == spec })
	}
	ref := o.Ref
	switch {
	case ref.Handle != 0:
		return slices.IndexFunc(c.Rules, func(x installed.Rule) bool { return x.Handle == ref.Handle })
	case ref.Spec != "":
		return slices.IndexFunc(c.Rules, func(x installed.Rule) bool { return x.Spec == ref.Spec })
	case ref.Position >= 1 && ref.Position <= len(c.Rules):
		return ref.Position - 1
	}
	return -1
}
