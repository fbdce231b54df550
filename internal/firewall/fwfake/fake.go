// Package fwfake is an in-memory firewall.Interface, in the spirit of
// knftables' Fake. It applies the same typed transactions (ruleset.Tx) the
// real firewall renders for the kernel, operation by operation, to tables
// it keeps, answers the same typed reads (package installed) and shows
// what it holds (Dump, Table). It never parses text: fixtures are loaded
// as typed tables (Load). Each transaction is all or nothing, with the
// kernel's refusals that meshwire relies on: creating what exists,
// deleting what is not there, removing a chain that is referred to or (in
// iptables) not empty, a jump to a missing chain, and rules appended over
// netlink to an iptables table iptables-nft has not made yet.
//
// Like the real reads, rules read from nf_tables (native tables, and the
// iptables tables of an nf_tables-backed iptables) carry a handle and no
// Spec, and those of legacy iptables a Spec and no handle.
package fwfake

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Fake is the in-memory firewall of one backend.
type Fake struct {
	b firewall.Backend
	// Fail, when set, is asked before each transaction with its route
	// (firewall.Route: "netlink", "restore v4", "restore v6", "nft"); an
	// error it returns fails the transaction, which then changes nothing.
	Fail func(route string) error

	mu     sync.Mutex
	tables map[ruleset.TableID]*table
	ipsets sets
	log    []Applied
}

// Applied is one transaction the Fake applied: the route the real
// firewall takes for it, and the transaction.
type Applied struct {
	Route string
	Tx    *ruleset.Tx
}

type table struct {
	comment  string
	iptables bool // an iptables table (built-in chains, Spec'd rules)
	chains   []*installed.Chain
	handle   uint64
	sets     sets                // a native table's
	setRefs  map[uint64][]string // the sets each rule (by handle) matches
}

var _ firewall.Interface = (*Fake)(nil)

// New returns an empty firewall of backend b.
func New(b firewall.Backend) *Fake {
	return &Fake{b: b, tables: map[ruleset.TableID]*table{}, ipsets: sets{}}
}

func (f *Fake) Backend() firewall.Backend { return f.b }

// Release returns nil: nothing waits for a kernel.
func (f *Fake) Release() *os.File { return nil }

// Ops lists the routes of the transactions applied so far, in order: a
// re-run that must change nothing is seen to add none.
func (f *Fake) Ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.log))
	for i, a := range f.log {
		out[i] = a.Route
	}
	return out
}

// Log lists the transactions applied so far.
func (f *Fake) Log() []Applied {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

// nftBacked: iptables tables live in nf_tables (reads show handles, not
// text).
func (f *Fake) nftBacked() bool {
	return f.b.Kind == firewall.IPTables && f.b.Variant != firewall.VariantLegacy
}

func (t *table) clone() *table {
	c := *t
	c.sets = t.sets.clone()
	c.setRefs = maps.Clone(t.setRefs)
	c.chains = make([]*installed.Chain, len(t.chains))
	for i, ch := range t.chains {
		x := *ch
		x.Rules = slices.Clone(ch.Rules)
		c.chains[i] = &x
	}
	return &c
}

func (t *table) chain(name string) *installed.Chain {
	if t == nil {
		return nil
	}
	for _, c := range t.chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// referenced reports whether a rule of the table jumps to chain.
func (t *table) referenced(chain string) bool {
	for _, c := range t.chains {
		for _, r := range c.Rules {
			if r.Jump == chain {
				return true
			}
		}
	}
	return false
}

// addRule adds r (read back from what was written, which matches the sets
// named) to chain c at index at (-1: the end).
func (t *table) addRule(c *installed.Chain, r installed.Rule, matched []string, at int) error {
	if r.Jump != "" && t.chain(r.Jump) == nil {
		return fmt.Errorf("jump to chain %s, which is not there: %w", r.Jump, unix.ENOENT)
	}
	t.handle++
	r.Handle, r.Table, r.Chain, r.Family = t.handle, c.Table, c.Name, c.Family
	if len(matched) > 0 {
		if t.setRefs == nil {
			t.setRefs = map[uint64][]string{}
		}
		t.setRefs[r.Handle] = matched
	}
	if at < 0 || at > len(c.Rules) {
		at = len(c.Rules)
	}
	c.Rules = slices.Insert(c.Rules, at, r)
	return nil
}

// Apply applies tx to a copy of the tables and keeps the copy when every
// operation succeeds.
func (f *Fake) Apply(_ context.Context, tx *ruleset.Tx) error {
	if tx.Empty() {
		return nil
	}
	if err := tx.Err(); err != nil {
		return err
	}
	route := firewall.Route(f.b, tx)
	if f.Fail != nil {
		if err := f.Fail(route); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range strings.Split(route, ", ") {
		if r == "nft" && f.b.Kind != firewall.NFTables || (strings.HasPrefix(r, "restore") || r == "ipset") && f.b.Kind != firewall.IPTables {
			return fmt.Errorf("%s on a %s firewall", r, f.b)
		}
	}
	state, ipsets, err := f.try(tx, route == "netlink")
	if err != nil && route == "netlink" && tx.OnlyAddsRules() {
		// As Host: iptables-restore makes the table netlink did not find.
		route = firewall.ToolRoute(f.b, tx)
		state, ipsets, err = f.try(tx, false)
	}
	if err != nil {
		return err
	}
	f.tables, f.ipsets = state, ipsets
	f.log = append(f.log, Applied{Route: route, Tx: tx})
	return nil
}

// try applies tx to a copy of the tables. Over netlink, iptables tables
// are not made on first use (iptables-nft makes them).
func (f *Fake) try(tx *ruleset.Tx, netlink bool) (map[ruleset.TableID]*table, sets, error) {
	state := make(map[ruleset.TableID]*table, len(f.tables))
	for k, t := range f.tables {
		state[k] = t.clone()
	}
	ipsets := f.ipsets.clone()
	for _, o := range tx.Ops() {
		if err := f.apply(state, ipsets, o, netlink); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", o, err)
		}
	}
	return state, ipsets, nil
}

// Load puts tables in place as they are given (fixtures: what other
// tools left on a host, parsed by the test), replacing those of the same
// name. An iptables table of an iptables backend gets the built-in chains
// it lacks.
func (f *Fake) Load(tables ...*installed.Table) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, lt := range tables {
		t := &table{comment: lt.Comment, iptables: f.isIPTables(lt.ID())}
		if t.iptables {
			t.chains = builtins(lt.ID())
		}
		for _, c := range lt.Chains {
			ch := t.chain(c.Name)
			if ch == nil {
				ch = &installed.Chain{Family: lt.Family, Table: lt.Name, Name: c.Name, Hook: c.Hook, Comment: c.Comment}
				t.chains = append(t.chains, ch)
			}
			for _, r := range c.Rules {
				if r.Spec == "" && t.iptables {
					r.Spec, _ = fwtext.InstalledIPTablesSpec(r)
				}
				t.handle++
				r.Handle, r.Family, r.Table, r.Chain = t.handle, lt.Family, lt.Name, c.Name
				ch.Rules = append(ch.Rules, r)
			}
		}
		f.tables[lt.ID()] = t
	}
}

// ---- reads ----

func (f *Fake) read(k ruleset.TableID) *installed.Table {
	t := f.tables[k]
	if t == nil {
		return nil
	}
	out := &installed.Table{Family: k.Family, Name: k.Name, Comment: t.comment}
	for _, c := range t.clone().chains {
		for i := range c.Rules {
			c.Rules[i].Position = i + 1
			if t.iptables && !f.nftBacked() {
				c.Rules[i].Handle = 0
			} else {
				c.Rules[i].Spec = ""
			}
		}
		out.Chains = append(out.Chains, c)
	}
	return out
}

func (f *Fake) ReadTable(_ context.Context, fam ruleset.Family, name string) (*installed.Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.read(ruleset.TableID{Family: fam, Name: name}), nil
}

func (f *Fake) ReadTables(_ context.Context, fam ruleset.Family, names []string) ([]*installed.Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*installed.Table
	for _, n := range names {
		if t := f.read(ruleset.TableID{Family: fam, Name: n}); t != nil {
			out = append(out, t)
		}
	}
	return out, nil
}

func (f *Fake) ReadChain(_ context.Context, fam ruleset.Family, tbl, chain string) (*installed.Chain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.read(ruleset.TableID{Family: fam, Name: tbl}).Chain(chain), nil
}

func (f *Fake) HasTable(_ context.Context, fam ruleset.Family, name string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tables[ruleset.TableID{Family: fam, Name: name}] != nil, nil
}

func (f *Fake) HasChain(_ context.Context, fam ruleset.Family, tbl, chain string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tables[ruleset.TableID{Family: fam, Name: tbl}].chain(chain) != nil, nil
}

func (f *Fake) ChainNames(_ context.Context, fam ruleset.Family, name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[ruleset.TableID{Family: fam, Name: name}]
	if t == nil {
		return nil, nil
	}
	// As the kernel keeps them: legacy iptables' built-in chains (first,
	// in hook order) and user chains in iptables' order (by name);
	// nf_tables' chains in the order they were made.
	var names, user []string
	for _, c := range t.chains {
		if t.iptables && !f.nftBacked() && c.Hook == "" {
			user = append(user, c.Name)
		} else {
			names = append(names, c.Name)
		}
	}
	slices.Sort(user)
	return append(names, user...), nil
}

func (f *Fake) Tables(_ context.Context, fam ruleset.Family) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k, t := range f.tables {
		if k.Family == fam && !t.iptables {
			out = append(out, k.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Table returns a table as a read would (nil when absent), for assertions.
func (f *Fake) Table(fam ruleset.Family, name string) *installed.Table {
	t, _ := f.ReadTable(context.Background(), fam, name)
	return t
}

// Dump renders the whole ruleset, iptables tables as iptables-save does
// and native tables as `nft list ruleset` (rules as they were written),
// sorted, for golden comparisons and failure messages.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]ruleset.TableID, 0, len(f.tables))
	for k := range f.tables {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b ruleset.TableID) int {
		if a.Family != b.Family {
			return int(a.Family) - int(b.Family)
		}
		return strings.Compare(a.Name, b.Name)
	})
	var b strings.Builder
	for _, k := range keys {
		t := f.tables[k]
		if t.iptables {
			fmt.Fprintf(&b, "# %s\n*%s\n", k.Family, k.Name)
			for _, c := range t.chains {
				if c.Hook != "" {
					fmt.Fprintf(&b, ":%s ACCEPT\n", c.Name)
				} else {
					fmt.Fprintf(&b, ":%s -\n", c.Name)
				}
			}
			for _, c := range t.chains {
				for _, r := range c.Rules {
					fmt.Fprintf(&b, "-A %s %s\n", c.Name, r.Spec)
				}
			}
			b.WriteString("COMMIT\n")
			continue
		}
		fmt.Fprintf(&b, "table %s %s {\n", k.Family, k.Name)
		if t.comment != "" {
			fmt.Fprintf(&b, "\tcomment %q\n", t.comment)
		}
		for _, name := range slices.Sorted(maps.Keys(t.sets)) {
			fmt.Fprintf(&b, "\tset %s {%s }\n", name, t.sets[name].text())
		}
		for _, c := range t.chains {
			fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
			if c.Comment != "" {
				fmt.Fprintf(&b, "\t\tcomment %q\n", c.Comment)
			}
			if c.Hook != "" {
				fmt.Fprintf(&b, "\t\thook %s\n", c.Hook)
			}
			for _, r := range c.Rules {
				fmt.Fprintf(&b, "\t\t%s\n", r.Spec)
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	for _, name := range slices.Sorted(maps.Keys(f.ipsets)) {
		fmt.Fprintf(&b, "ipset %s {%s }\n", name, f.ipsets[name].text())
	}
	return b.String()
}
