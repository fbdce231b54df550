package intercept

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"
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
			fmt.Fprintf(h, "-A %s %s\n", r.Chain, strings.Join(r.IPTables(), " "))
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:8]
}

// TagFor is the rule comment for a rule set fingerprint.
func TagFor(fingerprint string) string { return Tag + ":" + fingerprint }

// TableState is what an iptables-save shows of meshwire's rules in a table.
type TableState struct {
	Chains  []string       // own user chains present
	Builtin []string       // own rules in built-in chains, as "-A CHAIN ..." lines
	Rules   map[string]int // number of rules in each own chain
}

// State is meshwire's part of one family's iptables-save output.
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

// ParseSave finds meshwire's chains and rules in iptables-save output: the
// user chains of OwnChains, the rules in built-in chains that carry the Tag
// comment, and any rule that jumps into one of the own chains (so that a rule
// set left by istio-iptables is found too).
func ParseSave(save string) *State {
	s := &State{Tables: map[string]*TableState{}}
	var cur *TableState
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "*"):
			cur = &TableState{Rules: map[string]int{}}
			s.Tables[line[1:]] = cur
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			name := strings.Fields(line[1:])[0]
			if IsOwnChain(name) {
				cur.Chains = append(cur.Chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			if IsOwnChain(f[1]) {
				cur.Rules[f[1]]++
			}
			if !IsBuiltin(f[1]) {
				continue
			}
			if strings.Contains(line, Tag) || jumpsToOwn(f) {
				cur.Builtin = append(cur.Builtin, line)
			}
		}
	}
	return s
}

func jumpsToOwn(fields []string) bool {
	for i := 0; i+1 < len(fields); i++ {
		if (fields[i] == "-j" || fields[i] == "-g") && IsOwnChain(fields[i+1]) {
			return true
		}
	}
	return false
}

// Status is how the installed rules relate to a desired rule set.
type Status int

const (
	Absent    Status = iota // nothing of meshwire's is installed
	Current                 // exactly the desired rule set is installed
	Different               // something else of meshwire's (or istio-iptables') is installed
)

func (s Status) String() string {
	return [...]string{"absent", "current", "different"}[s]
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
	for n := range names {
		have := st.Tables[n]
		if have == nil {
			have = &TableState{}
		}
		want := desired.Table(n)
		if want == nil {
			want = &TableRules{Name: n}
		}
		if !sameSet(have.Chains, want.Chains) {
			return Different
		}
		nb := 0
		counts := map[string]int{}
		for _, r := range want.Rules {
			if IsBuiltin(r.Chain) {
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
		for _, line := range have.Builtin {
			if !strings.Contains(line, tag+" ") && !strings.HasSuffix(line, tag) && !strings.Contains(line, `"`+tag+`"`) {
				return Different
			}
		}
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

// Restore renders the iptables-restore (--noflush) payload that turns the
// installed state st into the desired rule set, in one transaction per
// table: own chains are declared (created or flushed), meshwire's old rules
// in built-in chains deleted, the new rules appended, and own chains no
// longer wanted removed. Tables that gain rules come before tables that
// lose them all, so that while iptables-restore commits table after table
// there is never a moment where neither the old nor the new interception
// holds. With st empty this is a fresh install; with desired empty, a
// cleanup. It returns "" when there is nothing to do.
func Restore(desired *RuleSet, st *State) string {
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
	var b strings.Builder
	for _, name := range order {
		want := desired.Table(name)
		if want == nil {
			want = &TableRules{Name: name}
		}
		have := st.Tables[name]
		if have == nil {
			have = &TableState{}
		}
		fmt.Fprintf(&b, "*%s\n", name)
		chains := append([]string(nil), want.Chains...)
		for _, c := range have.Chains {
			if !slices.Contains(chains, c) {
				chains = append(chains, c)
			}
		}
		for _, c := range chains {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
		for _, line := range have.Builtin {
			fmt.Fprintf(&b, "-D%s\n", strings.TrimPrefix(line, "-A"))
		}
		for _, r := range want.Rules {
			args := r.IPTables()
			if IsBuiltin(r.Chain) {
				n := targetStart(args)
				args = append(append(append([]string(nil), args[:n]...), "-m", "comment", "--comment", tag), args[n:]...)
			}
			fmt.Fprintf(&b, "-A %s %s\n", r.Chain, strings.Join(args, " "))
		}
		for _, c := range have.Chains {
			if !slices.Contains(want.Chains, c) {
				fmt.Fprintf(&b, "-X %s\n", c)
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

func targetStart(args []string) int {
	for i, a := range args {
		if a == "-j" {
			return i
		}
	}
	return len(args)
}
