package intercept

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Fingerprint identifies a rule set: the first 8 hex digits of the SHA-256
// of its rules. Every rule meshwire puts into a built-in chain carries it in
// its comment, so that a re-run can tell "already applied" from "applied
// with other flags".
func (rs *RuleSet) Fingerprint() string {
	h := sha256.New()
	fmt.Fprintf(h, "family %d\n", rs.Family)
	for _, t := range rs.Tables {
		fmt.Fprintf(h, "*%s %s\n", t.Name, strings.Join(t.Chains, " "))
		for _, r := range t.Rules {
			if rs.Family == 0 {
				fmt.Fprintf(h, "add rule %s %s\n", r.Chain, fwtext.NftRule(r, NftChain))
			} else {
				fmt.Fprintf(h, "-A %s %s\n", r.Chain, strings.Join(fwtext.IPTablesArgs(r), " "))
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:8]
}

// TagFor is the rule comment for a rule set fingerprint.
func TagFor(fingerprint string) string { return Tag + ":" + fingerprint }

// TableState is meshwire's part of one iptables table, as read back.
type TableState struct {
	Chains []string // own user chains present
	// Builtin are meshwire's rules in built-in chains: those carrying the
	// Tag comment, and any that jumps into an own chain (so that a rule
	// set left by istio-iptables is found too).
	Builtin []installed.Rule
	Rules   map[string]int // number of rules in each own chain
}

// State is meshwire's part of one family's iptables tables.
type State struct {
	Tables map[string]*TableState
}

// Empty reports whether nothing of meshwire's is installed.
func (s *State) Empty() bool {
	for _, t := range s.Tables {
		if len(t.Chains) > 0 || len(t.Builtin) > 0 {
			return false
		}
	}
	return true
}

// ReadState finds meshwire's chains and rules in iptables tables read
// back through the firewall (nil tables, those not there, are skipped):
// the user chains of OwnChains, and the rules of built-in chains that
// carry the Tag comment or jump into an own chain.
func ReadState(tables ...*installed.Table) *State {
	s := &State{Tables: map[string]*TableState{}}
	for _, t := range tables {
		if t == nil {
			continue
		}
		ts := &TableState{Rules: map[string]int{}}
		s.Tables[t.Name] = ts
		for _, c := range t.Chains {
			if IsOwnChain(c.Name) {
				ts.Chains = append(ts.Chains, c.Name)
				ts.Rules[c.Name] = len(c.Rules)
				continue
			}
			if !ruleset.IsBuiltin(c.Name) {
				continue
			}
			for _, r := range c.Rules {
				if strings.Contains(r.Comment, Tag) || IsOwnChain(r.Jump) {
					ts.Builtin = append(ts.Builtin, r)
				}
			}
		}
	}
	return s
}

// Status is how the installed rules relate to a desired rule set.
type Status int

const (
	Absent    Status = iota // nothing of meshwire's is installed
	Current                 // exactly the desired rule set is installed
	Different               // something else of meshwire's (or istio-iptables') is installed
	// Partial: some tables hold exactly the desired rule set's (their
	// rules carry its fingerprint), the others nothing: an install of the
	// same settings cut short between two tables' commits (a killed init
	// container), which the next install completes without a reconcile.
	Partial
)

func (s Status) String() string {
	return [...]string{"absent", "current", "different", "partial"}[s]
}

// Compare tells whether the state holds exactly the desired rule set.
func Compare(desired *RuleSet, st *State) Status {
	if st.Empty() {
		if desired.Empty() {
			return Current
		}
		return Absent
	}
	tag := TagFor(desired.Fingerprint())
	names := map[string]bool{}
	for n := range st.Tables {
		names[n] = true
	}
	for _, t := range desired.Tables {
		names[t.Name] = true
	}
	missing := 0
	for n := range names {
		have := st.Tables[n]
		if have == nil {
			have = &TableState{}
		}
		want := desired.Table(n)
		if want == nil {
			want = &TableRules{Name: n}
		}
		if len(have.Chains) == 0 && len(have.Builtin) == 0 && len(want.Rules) > 0 {
			missing++ // not written yet
			continue
		}
		if !sameSet(have.Chains, want.Chains) {
			return Different
		}
		nb := 0
		counts := map[string]int{}
		for _, r := range want.Rules {
			if ruleset.IsBuiltin(r.Chain) {
				nb++
			} else {
				counts[r.Chain]++
			}
		}
		if nb != len(have.Builtin) {
			return Different
		}
		for _, c := range want.Chains {
			if counts[c] != have.Rules[c] {
				return Different
			}
		}
		for _, r := range have.Builtin {
			if r.Comment != tag {
				return Different
			}
		}
	}
	if missing > 0 {
		return Partial
	}
	return Current
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	x := append([]string(nil), a...)
	y := append([]string(nil), b...)
	sort.Strings(x)
	sort.Strings(y)
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

// Restore is the transaction (one iptables-restore --noflush) that turns
// the installed state st into the desired rule set, in one block per
// table: own chains are declared (created or flushed), meshwire's old
// rules in built-in chains deleted, the new rules appended, and own chains
// no longer wanted removed. Tables that gain rules come before tables that
// lose them all, so that while iptables-restore commits table after table
// there is never a moment where neither the old nor the new interception
// holds. With st empty this is a fresh install; with desired empty, a
// cleanup. It is empty when there is nothing to do.
func Restore(desired *RuleSet, st *State) *ruleset.Tx {
	tag := TagFor(desired.Fingerprint())
	var order []string
	for _, t := range desired.Tables {
		order = append(order, t.Name)
	}
	for _, n := range tableOrder {
		if ts := st.Tables[n]; ts != nil && desired.Table(n) == nil && (len(ts.Chains) > 0 || len(ts.Builtin) > 0) {
			order = append(order, n)
		}
	}
	tx := &ruleset.Tx{}
	for _, name := range order {
		id := ruleset.TableID{Family: desired.Family.Tables(), Name: name}
		want := desired.Table(name)
		if want == nil {
			want = &TableRules{Name: name}
		}
		have := st.Tables[name]
		if have == nil {
			have = &TableState{}
		}
		chains := append([]string(nil), want.Chains...)
		for _, c := range have.Chains {
			if !slices.Contains(chains, c) {
				chains = append(chains, c)
			}
		}
		for _, c := range chains {
			tx.AddChain(id, ruleset.Chain{Name: c})
		}
		for _, ref := range deletions(have.Builtin) {
			tx.DeleteRef(id, ref)
		}
		for _, r := range want.Rules {
			if ruleset.IsBuiltin(r.Chain) {
				r.Comment = tag
			}
			tx.AddRule(id, r)
		}
		for _, c := range have.Chains {
			if !slices.Contains(want.Chains, c) {
				tx.DeleteChain(id, c)
			}
		}
	}
	return tx
}

// deletions names meshwire's rules in built-in chains for their removal:
// by the rule as iptables-save printed it when it was read from text
// (legacy iptables), else by its position (read over netlink, where the
// typed fields cannot render matches such as owner or conntrack). Positions count in the
// state read, so they go first, last rule first, and the rules named by
// their text after them. Only meshwire writes a pod's interception rules,
// so the positions read are those the transaction finds.
func deletions(rules []installed.Rule) []ruleset.RuleRef {
	var byPos, bySpec []installed.Rule
	for _, r := range rules {
		if r.Spec != "" {
			bySpec = append(bySpec, r)
		} else {
			byPos = append(byPos, r)
		}
	}
	slices.SortStableFunc(byPos, func(a, b installed.Rule) int {
		if a.Chain != b.Chain {
			return strings.Compare(a.Chain, b.Chain)
		}
		return b.Position - a.Position
	})
	var out []ruleset.RuleRef
	for _, r := range byPos {
		out = append(out, ruleset.RuleRef{Chain: r.Chain, Position: r.Position})
	}
	for _, r := range bySpec {
		out = append(out, ruleset.RuleRef{Chain: r.Chain, Spec: r.Spec})
	}
	return out
}

// TProxyMarks lists the marks the TPROXY rules of tables read back set.
func TProxyMarks(tables ...*installed.Table) []uint32 {
	var out []uint32
	for _, t := range tables {
		for _, r := range t.Rules() {
			if r.Target == "TPROXY" && r.SetMark != 0 && !slices.Contains(out, r.SetMark) {
				out = append(out, r.SetMark)
			}
		}
	}
	return out
}
