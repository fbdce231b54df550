package apply

import (
	"slices"

	"github.com/meshwire/meshwire/internal/firewall/installed"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Planning is the pure half of Install, in a file of its own: what a
// namespace's firewall holds (Held, as read) and what is wanted (Want)
// give the operations that turn the one into the other (Ops), with no I/O,
// so that every case is a table test (plan_test.go). It sits beside the
// code that reads and applies, its only user, so that reading an install
// from Install down never leaves this package to come back.

// Held is what one firewall backend holds of the interception rules of a
// namespace, as read back.
type Held struct {
	// IPTables are each family's iptables tables that interception uses
	// (iptables backends); a family that could not be read is absent.
	IPTables map[intercept.Family][]*installed.Table
	// Nft are istio's inet tables found, by name (native nftables).
	Nft map[string]*installed.Table
	// LegacyNft are the families holding the table of earlier meshwire
	// versions (native nftables).
	LegacyNft []intercept.Family
}

// state is meshwire's part of family f's iptables tables; nil when they
// were not read.
func (h *Held) state(f intercept.Family) *intercept.State {
	tables, ok := h.IPTables[f]
	if !ok {
		return nil
	}
	return intercept.ReadState(tables...)
}

// Removal is the transactions that remove what h holds: one per family
// (iptables), or one nftables transaction; none when it holds nothing.
func (h *Held) Removal() []*ruleset.Tx {
	var out []*ruleset.Tx
	for _, f := range bothFamilies {
		if st := h.state(f); st != nil && !st.Empty() {
			out = append(out, intercept.Restore(&intercept.RuleSet{Family: f}, st))
		}
	}
	nft := intercept.NftLegacyRemoval(h.LegacyNft...)
	if len(h.Nft) > 0 {
		nft.Append(intercept.Nft(&intercept.RuleSet{}))
	}
	if !nft.Empty() {
		out = append(out, nft)
	}
	return out
}

// Marks lists the marks the TPROXY rules held set (iptables' mangle
// tables, or meshwire's nftables tables), so that cleanup finds policy
// routing installed with other flags.
func (h *Held) Marks() []uint32 {
	var tables []*installed.Table
	for _, f := range bothFamilies {
		tables = append(tables, h.IPTables[f]...)
	}
	for _, t := range h.Nft {
		tables = append(tables, t)
	}
	return intercept.TProxyMarks(tables...)
}

// Want is the interception asked for in a namespace.
type Want struct {
	Config intercept.Config
	IPv6   bool
	// NFTables: the rules go into native nftables (else iptables).
	NFTables bool
	// Force rewrites the rule set even when it is installed as asked
	// (istio's --force-apply).
	Force bool
}

// Ops are the operations that turn what a backend holds into what is
// wanted, and how the two compared.
type Ops struct {
	Families []intercept.Family                      // the families in use
	Sets     map[intercept.Family]*intercept.RuleSet // iptables, per family
	NftSet   *intercept.RuleSet                      // nftables, both families
	Status   map[intercept.Family]intercept.Status   // per family read
	Restore  map[intercept.Family]*ruleset.Tx        // iptables transactions, one per family (empty when nothing to do)
	Nft      *ruleset.Tx                             // the nftables transaction (empty when nothing to do)
	Add      []intercept.Step                        // routing to ensure
	Remove   []intercept.Step                        // routing to remove (a mode or family no longer used)
	// Different are the families holding other interception rules than
	// those wanted.
	Different []intercept.Family
	// Elsewhere are the removals of what the other backends given to
	// Operations hold, one entry each (none for one that holds nothing).
	Elsewhere [][]*ruleset.Tx
}

// Operations gives the operations that turn what have holds into want,
// and those that remove what the other backends hold (others). The family
// not in use gets an empty rule set: whatever was there before (a
// dual-stack run) is a difference to remove.
func Operations(have *Held, others []*Held, want Want) Ops {
	ops := Ops{
		Families: []intercept.Family{intercept.V4},
		Sets:     map[intercept.Family]*intercept.RuleSet{},
		Status:   map[intercept.Family]intercept.Status{},
		Restore:  map[intercept.Family]*ruleset.Tx{},
		Nft:      &ruleset.Tx{},
	}
	if want.IPv6 {
		ops.Families = bothFamilies
	}
	for _, f := range bothFamilies {
		if f == intercept.V6 && !want.IPv6 {
			ops.Sets[f] = &intercept.RuleSet{Family: f}
		} else {
			ops.Sets[f] = intercept.Build(want.Config, f)
		}
	}
	if !want.NFTables {
		for _, f := range bothFamilies {
			set, st := ops.Sets[f], have.state(f)
			if st == nil {
				continue
			}
			ops.Status[f] = intercept.Compare(set, st)
			if ops.Status[f] != intercept.Current || want.Force && !set.Empty() {
				ops.Restore[f] = intercept.Restore(set, st)
			}
		}
	} else {
		// One inet rule set for both families, as istio-nftables has it.
		set := intercept.BuildNft(want.Config, want.IPv6)
		ops.NftSet = set
		st := intercept.NftStatus(set, have.Nft)
		if len(have.LegacyNft) > 0 {
			st = intercept.Different
		}
		for _, f := range ops.Families {
			ops.Status[f] = st
		}
		if st != intercept.Current || want.Force && !set.Empty() {
			ops.Nft = intercept.NftLegacyRemoval(have.LegacyNft...)
			ops.Nft.Append(intercept.Nft(set))
		}
	}
	for _, f := range bothFamilies {
		if ops.Status[f] == intercept.Different {
			ops.Different = append(ops.Different, f)
		}
	}
	for _, o := range others {
		ops.Elsewhere = append(ops.Elsewhere, o.Removal())
	}
	ops.Add = intercept.Routing(want.Config, want.IPv6)
	tproxy := want.Config
	tproxy.Mode = intercept.ModeTProxy
	for _, s := range intercept.Routing(tproxy, true) {
		if !slices.Contains(ops.Add, s) {
			ops.Remove = append(ops.Remove, s)
		}
	}
	return ops
}
