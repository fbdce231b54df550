package firewall

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/meshwire/meshwire/internal/ruleset"
	"golang.org/x/sys/unix"
)

// Fake is an in-memory Interface, in the spirit of knftables' Fake: it
// applies typed tables (ReplaceTable) as they are, and takes what Restore,
// ApplyNft and AppendRules receive (the
// iptables-restore and nft script subset meshwire writes, and rules
// encoded for netlink), parses it into the same typed rules the real reads
// return, keeps the ruleset, answers reads and shows its state (Dump,
// Table), so that what plugins do with the firewall is tested without
// root. Each transaction is all or nothing, with the kernel's refusals
// that meshwire relies on: creating what exists (-N, create), deleting what
// is not there (-D, -X, delete), removing a chain that is referred to or
// not empty, a jump to a missing chain.
//
// Like the real reads, rules read from an nf_tables-backed table carry a
// handle and no Spec, and those of legacy iptables a Spec and no handle.
type Fake struct {
	b Backend
	// Fail, when set, is asked before each write ("restore", "nft",
	// "append", "delete-rules", "delete-tables", "replace-table"); an
	// error it returns fails the write, which then changes nothing.
	Fail func(op string) error

	mu     sync.Mutex
	tables map[tableKey]*fakeTable
	ops    []string
	log    []Tx
}

// Tx is one write the Fake applied: its op (see Ops), the family of an
// iptables-restore payload, and the payload or script (Restore, ApplyNft,
// and the iptables-restore payload that DeleteRules sends for legacy
// iptables; "" for netlink writes).
type Tx struct {
	Op     string
	Family Family
	Text   string
}

type tableKey struct {
	fam  TableFamily
	name string
}

type fakeTable struct {
	comment  string
	iptables bool // an iptables table (built-in chains, Spec'd rules)
	chains   []*Chain
	handle   uint64
}

// NewFake returns an empty firewall of backend b.
func NewFake(b Backend) *Fake { return &Fake{b: b, tables: map[tableKey]*fakeTable{}} }

func (f *Fake) Backend() Backend { return f.b }

// Release returns nil: nothing waits for a kernel.
func (f *Fake) Release() *os.File { return nil }

// Ops lists the writes applied so far, in order ("restore v4", "nft",
// "append", "delete-rules", "delete-tables", "replace-table"): a re-run
// that must change nothing is seen to add none.
func (f *Fake) Ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ops)
}

// Log lists the writes applied so far, with their payloads.
func (f *Fake) Log() []Tx {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

// nftBacked: reads of an iptables table show handles, not text.
func (f *Fake) nftBacked() bool { return f.b.Kind == IPTables && f.b.Variant != VariantLegacy }

func (t *fakeTable) clone() *fakeTable {
	c := *t
	c.chains = make([]*Chain, len(t.chains))
	for i, ch := range t.chains {
		x := *ch
		x.Rules = slices.Clone(ch.Rules)
		c.chains[i] = &x
	}
	return &c
}

func (t *fakeTable) chain(name string) *Chain {
	for _, c := range t.chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// referenced reports whether a rule of the table jumps to chain.
func (t *fakeTable) referenced(chain string) bool {
	for _, c := range t.chains {
		for _, r := range c.Rules {
			if r.Jump == chain {
				return true
			}
		}
	}
	return false
}

func (t *fakeTable) addRule(c *Chain, r Rule, at int) error {
	if r.Jump != "" && t.chain(r.Jump) == nil {
		return fmt.Errorf("jump to chain %s, which is not there: %w", r.Jump, unix.ENOENT)
	}
	t.handle++
	r.Handle, r.Table, r.Chain, r.Family = t.handle, c.Table, c.Name, c.Family
	if at < 0 || at > len(c.Rules) {
		at = len(c.Rules)
	}
	c.Rules = slices.Insert(c.Rules, at, r)
	return nil
}

// tx runs fn on a copy of the ruleset and keeps the copy when it succeeds.
func (f *Fake) tx(op string, fn func(state map[tableKey]*fakeTable) error) error {
	return f.txLog(Tx{Op: op}, fn)
}

func (f *Fake) txLog(x Tx, fn func(state map[tableKey]*fakeTable) error) error {
	op := x.Op
	if f.Fail != nil {
		if err := f.Fail(op); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	state := make(map[tableKey]*fakeTable, len(f.tables))
	for k, t := range f.tables {
		state[k] = t.clone()
	}
	if err := fn(state); err != nil {
		return err
	}
	f.tables = state
	f.ops = append(f.ops, op)
	f.log = append(f.log, x)
	return nil
}

// ---- reads ----

func (f *Fake) read(k tableKey) *Table {
	t := f.tables[k]
	if t == nil {
		return nil
	}
	out := &Table{Family: k.fam, Name: k.name, Comment: t.comment}
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

func (f *Fake) ReadTable(_ context.Context, fam TableFamily, table string) (*Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.read(tableKey{fam, table}), nil
}

func (f *Fake) ReadTables(_ context.Context, fam TableFamily, names []string) ([]*Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*Table
	for _, n := range names {
		if t := f.read(tableKey{fam, n}); t != nil {
			out = append(out, t)
		}
	}
	return out, nil
}

func (f *Fake) ReadChain(_ context.Context, fam TableFamily, table, chain string) (*Chain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.read(tableKey{fam, table}).Chain(chain), nil
}

func (f *Fake) HasTable(_ context.Context, fam TableFamily, table string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tables[tableKey{fam, table}] != nil, nil
}

func (f *Fake) HasChain(_ context.Context, fam TableFamily, table, chain string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tables[tableKey{fam, table}].chainOrNil(chain) != nil, nil
}

func (f *Fake) ChainNames(_ context.Context, fam TableFamily, table string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[tableKey{fam, table}]
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

func (f *Fake) Tables(_ context.Context, fam TableFamily) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k, t := range f.tables {
		if k.fam == fam && !t.iptables {
			out = append(out, k.name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Table returns a table as a read would (nil when absent), for assertions.
func (f *Fake) Table(fam TableFamily, name string) *Table {
	t, _ := f.ReadTable(context.Background(), fam, name)
	return t
}

// Dump renders the whole ruleset, iptables tables as iptables-save does
// and native tables as `nft list ruleset` (rules as they were written),
// sorted, for golden comparisons.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]tableKey, 0, len(f.tables))
	for k := range f.tables {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b tableKey) int {
		if a.fam != b.fam {
			return int(a.fam) - int(b.fam)
		}
		return strings.Compare(a.name, b.name)
	})
	var b strings.Builder
	for _, k := range keys {
		t := f.tables[k]
		if t.iptables {
			fmt.Fprintf(&b, "# %s\n*%s\n", k.fam.Name(), k.name)
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
		fmt.Fprintf(&b, "table %s %s {\n", k.fam.Name(), k.name)
		if t.comment != "" {
			fmt.Fprintf(&b, "\tcomment %q\n", t.comment)
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
	return b.String()
}

// ---- writes ----

func (f *Fake) ApplyNft(_ context.Context, script string) error {
	return f.txLog(Tx{Op: "nft", Text: script}, func(state map[tableKey]*fakeTable) error { return applyNftScript(state, script) })
}

func (f *Fake) AppendRules(_ context.Context, table string, rules []ruleset.Rule) error {
	if !f.nftBacked() {
		return fmt.Errorf("AppendRules needs an nf_tables-backed iptables, have %s", f.b)
	}
	encoded, err := encodeRules(table, rules)
	if err != nil {
		return err
	}
	return f.tx("append", func(state map[tableKey]*fakeTable) error {
		for _, nr := range encoded {
			fam := nr.Family
			t := state[tableKey{fam, nr.Table}]
			if t == nil || t.chain(nr.Chain) == nil {
				return fmt.Errorf("append to %s %s %s: %w", fam.Name(), nr.Table, nr.Chain, unix.ENOENT)
			}
			// Kept as a netlink read of the encoded rule gives it back.
			r := decodeAppended(nr)
			r.Spec, _ = r.IPTablesSpec()
			if err := t.addRule(t.chain(nr.Chain), r, -1); err != nil {
				return err
			}
		}
		return nil
	})
}

func (f *Fake) DeleteRules(ctx context.Context, rules []Rule) error {
	if len(rules) > 0 && (rules[0].Family == IP || rules[0].Family == IP6) && !f.nftBacked() {
		// Legacy iptables: the payload Host sends.
		for _, fam := range []Family{V4, V6} {
			payload, err := deletePayload(fam, rules)
			if err != nil || payload == "" {
				if err != nil {
					return err
				}
				continue
			}
			err = f.txLog(Tx{Op: "delete-rules", Family: fam, Text: payload}, func(state map[tableKey]*fakeTable) error {
				return applyRestore(state, fam, payload)
			})
			if err != nil {
				return fmt.Errorf("%w: %v", ErrNotFound, err)
			}
		}
		return nil
	}
	return f.tx("delete-rules", func(state map[tableKey]*fakeTable) error {
		for _, r := range rules {
			t := state[tableKey{r.Family, r.Table}]
			c := t.chainOrNil(r.Chain)
			if c == nil {
				return fmt.Errorf("delete a rule of %s %s %s: %w", r.Family.Name(), r.Table, r.Chain, ErrNotFound)
			}
			i := slices.IndexFunc(c.Rules, func(x Rule) bool {
				if r.Handle != 0 {
					return x.Handle == r.Handle
				}
				return x.Spec == r.Spec
			})
			if i < 0 {
				return fmt.Errorf("delete a rule of %s %s %s: %w", r.Family.Name(), r.Table, r.Chain, ErrNotFound)
			}
			c.Rules = slices.Delete(c.Rules, i, i+1)
		}
		return nil
	})
}

func (t *fakeTable) chainOrNil(name string) *Chain {
	if t == nil {
		return nil
	}
	return t.chain(name)
}

func (f *Fake) DeleteTables(_ context.Context, fam TableFamily, names []string) error {
	if len(names) == 0 {
		return nil
	}
	return f.tx("delete-tables", func(state map[tableKey]*fakeTable) error {
		for _, n := range names {
			delete(state, tableKey{fam, n})
		}
		return nil
	})
}

// ---- iptables-restore ----

// builtinChains are the built-in chains of each iptables table.
var builtinChains = map[string][]string{
	"filter":   {"INPUT", "FORWARD", "OUTPUT"},
	"nat":      {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle":   {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":      {"PREROUTING", "OUTPUT"},
	"security": {"INPUT", "FORWARD", "OUTPUT"},
}

func (f *Fake) Restore(_ context.Context, fam Family, payload string) error {
	if f.b.Kind != IPTables {
		return fmt.Errorf("Restore needs an iptables backend, have %s", f.b)
	}
	return f.txLog(Tx{Op: "restore v" + strconv.Itoa(int(fam)), Family: fam, Text: payload}, func(state map[tableKey]*fakeTable) error {
		return applyRestore(state, fam, payload)
	})
}

func iptablesTable(state map[tableKey]*fakeTable, fam Family, name string) (*fakeTable, error) {
	k := tableKey{fam.Tables(), name}
	if t := state[k]; t != nil {
		return t, nil
	}
	builtins, ok := builtinChains[name]
	if !ok {
		return nil, fmt.Errorf("iptables-restore: unknown table %q", name)
	}
	t := &fakeTable{iptables: true}
	for _, c := range builtins {
		t.chains = append(t.chains, &Chain{Family: k.fam, Table: name, Name: c, Hook: builtinHook(c)})
	}
	state[k] = t
	return t, nil
}

func applyRestore(state map[tableKey]*fakeTable, fam Family, payload string) error {
	var t *fakeTable
	table := ""
	for n, line := range strings.Split(payload, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fail := func(format string, a ...any) error {
			return fmt.Errorf("iptables-restore: line %d (%s): %w", n+1, line, fmt.Errorf(format, a...))
		}
		switch {
		case strings.HasPrefix(line, "*"):
			var err error
			table = line[1:]
			if t, err = iptablesTable(state, fam, table); err != nil {
				return err
			}
			continue
		case line == "COMMIT":
			t = nil
			continue
		case t == nil:
			return fail("outside a table")
		case strings.HasPrefix(line, ":"):
			name := strings.Fields(line[1:])[0]
			if c := t.chain(name); c != nil {
				if c.Hook == "" {
					c.Rules = nil // declared again: flushed
				}
			} else {
				t.chains = append(t.chains, &Chain{Family: fam.Tables(), Table: table, Name: name})
			}
			continue
		}
		args := SplitArgs(line)
		if len(args) < 2 {
			return fail("no chain")
		}
		cmd, name := args[0], args[1]
		c := t.chain(name)
		if c == nil && cmd != "-N" {
			return fail("no chain/target/match by that name: %w", unix.ENOENT)
		}
		switch cmd {
		case "-N":
			if c != nil {
				return fail("chain already exists: %w", unix.EEXIST)
			}
			t.chains = append(t.chains, &Chain{Family: fam.Tables(), Table: table, Name: name})
		case "-F":
			c.Rules = nil
		case "-X":
			switch {
			case c.Hook != "":
				return fail("cannot delete built-in chain")
			case len(c.Rules) > 0:
				return fail("directory not empty: %w", unix.ENOTEMPTY)
			case t.referenced(name):
				return fail("too many links: %w", unix.EMLINK)
			}
			t.chains = slices.DeleteFunc(t.chains, func(x *Chain) bool { return x.Name == name })
		case "-A", "-I":
			at, rest := -1, args[2:]
			if cmd == "-I" {
				at = 0
				if len(rest) > 0 {
					if n, err := strconv.Atoi(rest[0]); err == nil {
						at, rest = n-1, rest[1:]
					}
				}
			}
			r := specRule(fam, table, name, rest)
			if r.Jump != "" && t.chain(r.Jump) == nil {
				return fail("couldn't load target `%s': %w", r.Jump, unix.ENOENT)
			}
			if err := t.addRule(c, r, at); err != nil {
				return fail("%v", err)
			}
		case "-D":
			rest := args[2:]
			i := -1
			if len(rest) == 1 {
				if n, err := strconv.Atoi(rest[0]); err == nil && n >= 1 && n <= len(c.Rules) {
					i = n - 1
				}
			}
			if i < 0 {
				spec := specRule(fam, table, name, rest).Spec
				i = slices.IndexFunc(c.Rules, func(x Rule) bool { return x.Spec == spec })
			}
			if i < 0 {
				return fail("bad rule (does a matching rule exist in that chain?): %w", unix.ENOENT)
			}
			c.Rules = slices.Delete(c.Rules, i, i+1)
		default:
			return fail("unknown command %s", cmd)
		}
	}
	if t != nil {
		return fmt.Errorf("iptables-restore: no COMMIT for table %s", table)
	}
	return nil
}

// specRule parses rule arguments into a Rule whose Spec is their
// iptables-save form.
func specRule(fam Family, table, chain string, args []string) Rule {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = ruleset.QuoteArg(a)
	}
	r := Rule{Family: fam.Tables(), Table: table, Chain: chain, Spec: strings.Join(q, " ")}
	parseIPTablesArgs(fam, &r, args)
	return r
}
