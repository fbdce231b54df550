package fwfake

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Sets, as the real firewall holds them: a native nftables table's sets
// (with it), or the namespace's ipsets with the iptables backends. A rule
// that matches a set needs it there, and a set a rule matches cannot be
// removed (the kernel's EBUSY); an element added twice is there once (an
// ipset's comment replaced), and a removal of an element or set that is
// not there is no error, as the Host does it.

// set is one set's elements, in the order they were added.
type set struct {
	family ruleset.IPVersion
	elems  []ruleset.Element
}

func (s *set) clone() *set { return &set{family: s.family, elems: slices.Clone(s.elems)} }

// sets are the sets of a table, or the ipsets, by name.
type sets map[string]*set

func (ss sets) clone() sets {
	out := sets{}
	for k, s := range ss {
		out[k] = s.clone()
	}
	return out
}

// declare makes set s when it is not there; one of another family is an
// error.
func (ss sets) declare(s ruleset.Set) error {
	if have, ok := ss[s.Name]; ok {
		if have.family != s.Family {
			return fmt.Errorf("set %s is of %v: %w", s.Name, have.family, unix.EEXIST)
		}
		return nil
	}
	ss[s.Name] = &set{family: s.Family}
	return nil
}

// applySet applies a set or element operation to the sets ss, where
// inUse tells whether a rule matches a set.
func applySet(ss sets, o ruleset.Op, inUse func(name string) bool) error {
	name := o.Set.Name
	s := ss[name]
	switch o.Object() + " " + o.Verb.String() {
	case "set add":
		return ss.declare(*o.Set)
	case "set destroy":
		if s != nil && inUse(name) {
			return fmt.Errorf("set %s is in use by a rule: %w", name, unix.EBUSY)
		}
		delete(ss, name)
		return nil
	case "element destroy":
		if s != nil {
			s.elems = slices.DeleteFunc(s.elems, func(e ruleset.Element) bool {
				return slices.ContainsFunc(o.Elements, func(x ruleset.Element) bool { return x.Addr == e.Addr })
			})
		}
		return nil
	}
	if s == nil {
		return fmt.Errorf("no set %s: %w", name, unix.ENOENT)
	}
	switch o.Object() + " " + o.Verb.String() {
	case "set flush":
		s.elems = nil
	case "element add":
		for _, e := range o.Elements {
			if i := slices.IndexFunc(s.elems, func(x ruleset.Element) bool { return x.Addr == e.Addr }); i >= 0 {
				s.elems[i] = e
			} else {
				s.elems = append(s.elems, e)
			}
		}
	default:
		return fmt.Errorf("not a set operation")
	}
	return nil
}

// setsMatched are the sets rule r matches.
func setsMatched(r ruleset.Rule) []string {
	var out []string
	for _, m := range r.Match {
		if m.Kind == ruleset.MatchDstSet {
			out = append(out, m.Name)
		}
	}
	return out
}

// usesSet tells whether a rule of the tables of state (the iptables
// tables when ipsets, else the native table id) matches set name.
func usesSet(state map[ruleset.TableID]*table, id ruleset.TableID, ipsets bool, name string) bool {
	for tid, t := range state {
		if ipsets && !t.iptables || !ipsets && tid != id {
			continue
		}
		for _, c := range t.chains {
			for _, r := range c.Rules {
				if slices.Contains(t.setRefs[r.Handle], name) {
					return true
				}
			}
		}
	}
	return false
}

// applySetOp applies a set or element operation to state.
func (f *Fake) applySetOp(state map[ruleset.TableID]*table, ipsets sets, o ruleset.Op) error {
	if o.IPSet() {
		if f.b.Kind != firewall.IPTables {
			return fmt.Errorf("ipsets on a %s firewall", f.b)
		}
		return applySet(ipsets, o, func(name string) bool { return usesSet(state, o.Table, true, name) })
	}
	t := state[o.Table]
	if t != nil && t.sets == nil {
		t.sets = sets{}
	}
	if t == nil || t.iptables {
		if o.Object() == "element" && o.Verb == ruleset.Destroy {
			return nil // the Host removes only what is there
		}
		return fmt.Errorf("no table %s for set %s: %w", o.Table, o.Set.Name, unix.ENOENT)
	}
	return applySet(t.sets, o, func(name string) bool { return usesSet(state, o.Table, false, name) })
}

// checkSets refuses a rule that matches a set that is not among have.
func checkSets(have sets, r ruleset.Rule) error {
	for _, name := range setsMatched(r) {
		if have[name] == nil {
			return fmt.Errorf("the rule matches set %s, which is not there: %w", name, unix.ENOENT)
		}
	}
	return nil
}

// text is the set's elements as Dump writes them.
func (s *set) text() string {
	var b strings.Builder
	for _, e := range s.elems {
		b.WriteString(" " + e.Addr.String())
		if e.Comment != "" {
			b.WriteString(" " + strconv.Quote(e.Comment))
		}
	}
	return b.String()
}

func (f *Fake) ReadSet(_ context.Context, id ruleset.TableID, name string) (*installed.Set, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var s *set
	if id.IsIPSets() {
		s = f.ipsets[name]
	} else if t := f.tables[id]; t != nil {
		s = t.sets[name]
	}
	if s == nil {
		return nil, nil
	}
	return &installed.Set{Table: id, Name: name, Elements: slices.Clone(s.elems)}, nil
}

// Set returns a set as a read would (nil when absent), for assertions.
func (f *Fake) Set(id ruleset.TableID, name string) *installed.Set {
	s, _ := f.ReadSet(context.Background(), id, name)
	return s
}

// IPSets lists the names of the ipsets, sorted.
func (f *Fake) IPSets() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.ipsets))
	for name := range f.ipsets {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
